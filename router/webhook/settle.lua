-- Claimed entries, with each user's latest live route deadline (0: none). An entry whose
-- epoch is no longer the user's is dropped (the user reconnected: fenced); one whose user
-- still has a live route is checked again at that route's deadline (a crashed gateway's
-- routes lapse then); otherwise user.offline is sent, once per epoch. KEYS: due, events,
-- overflow. ARGV: now, keep ms, maxlen, presence prefix, then (member, quoted uid,
-- deadline) triples. Returns {offline sent, fenced, checked again, refused}.
-- After emit_fn.lua.
local maxlen, pfx = tonumber(ARGV[3]), ARGV[4]
local sent, fenced, again, refused = 0, 0, 0, 0
for i = 5, #ARGV, 3 do
  local m, quoted, live = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local c = string.find(m, ':', 1, true)
  local epoch, p = string.sub(m, 1, c - 1), pfx .. string.sub(m, c + 1)
  if redis.call('HGET', p, 'e') ~= epoch then
    redis.call('ZREM', KEYS[1], m)
    fenced = fenced + 1
  elseif live > 0 then
    redis.call('ZADD', KEYS[1], live, m)
    again = again + 1
  else
    redis.call('ZREM', KEYS[1], m)
    if redis.call('HGET', p, 'r') ~= epoch then
      local json = presence_event('user.offline', epoch, ARGV[1], quoted)
      if emit(KEYS[2], KEYS[3], maxlen, json) == 1 then
        redis.call('HSET', p, 'r', epoch)
        redis.call('PEXPIRE', p, ARGV[2])
        sent = sent + 1
      else
        refused = refused + 1
      end
    end
  end
end
return {sent, fenced, again, refused}
