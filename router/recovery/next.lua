-- Every sequence is a hash: `n` its counter, `e` its epoch (the Redis clock in ms when
-- the counter was created: `shared.positions`). A Redis that lost the hash (a restart
-- without persistence, a shard that lost data) starts it again at n = 1 under a new,
-- later epoch, which readers see as a jump, not as old numbers coming back. `h` holds
-- the hash's `e`, `a`, `f`, `x`, `y` and `l` (a user's acked position, inbox floor,
-- until when its sequence and its log are kept, and whether a legacy inbox may exist:
-- append_user.lua; a topic's sequence has none of them), read with the epoch at once.
local n = redis.call('HINCRBY', KEYS[1], 'n', 1)
local h = redis.call('HMGET', KEYS[1], 'e', 'a', 'f', 'x', 'y', 'l')
local e = h[1]
if not e then
  local t = redis.call('TIME')
  e = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  redis.call('HSET', KEYS[1], 'e', e)
end
