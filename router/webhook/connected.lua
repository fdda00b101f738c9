-- New connections. KEYS: events, overflow, the gateway's users, gws. ARGV: now, keep ms,
-- maxlen, presence prefix, gateway id, then (uid, quoted uid) pairs. Each gets a new
-- epoch; a user reported offline gets user.online with it. Returns how many were refused.
-- After emit_fn.lua.
local now, maxlen, pfx = tonumber(ARGV[1]), tonumber(ARGV[3]), ARGV[4]
local refused = 0
redis.call('SADD', KEYS[4], ARGV[5])
for i = 6, #ARGV, 2 do
  local uid, quoted = ARGV[i], ARGV[i + 1]
  local p = pfx .. uid
  local e = tonumber(redis.call('HGET', p, 'e') or '0')
  local epoch = string.format('%.0f', math.max(e + 1, now))
  redis.call('HSET', p, 'e', epoch)
  if redis.call('HGET', p, 'r') then
    redis.call('HDEL', p, 'r')
    local json = presence_event('user.online', epoch, ARGV[1], quoted)
    refused = refused + 1 - emit(KEYS[1], KEYS[2], maxlen, json)
  end
  redis.call('PEXPIRE', p, ARGV[2])
  redis.call('SADD', KEYS[3], uid)
end
return refused
