-- Adds one event unless the outbox is full; a refused one is counted in `overflow`.
-- `presence_event` builds a user.online or user.offline event from a quoted uid.
local function emit(stream, overflow, maxlen, json)
  if redis.call('XLEN', stream) >= maxlen then
    redis.call('INCR', overflow)
    return 0
  end
  redis.call('XADD', stream, '*', 'e', json)
  return 1
end
local function presence_event(kind, epoch, ts, quoted)
  return '{"event_id":"' .. kind .. ':' .. epoch .. ':' .. string.sub(quoted, 2, -2)
    .. '","type":"' .. kind .. '","ts":' .. ts .. ',"uid":' .. quoted
    .. ',"epoch":' .. epoch .. '}'
end
