-- Moves one uid to a state if that is up from where it is, keeping the counters.
local rank = {q = 1, x = 2, d = 3, a = 4}
local function move(k, uid, new)
  local f = 'u:' .. uid
  local cur = redis.call('HGET', k, f)
  if cur and rank[new] <= rank[cur] then return 0 end
  redis.call('HSET', k, f, new)
  redis.call('HINCRBY', k, 'c' .. new, 1)
  if cur then redis.call('HINCRBY', k, 'c' .. cur, -1) end
  return 1
end
