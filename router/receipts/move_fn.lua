-- Moves one uid to a state if that is up from where it is, keeping the counters. `cur`:
-- its state if the caller read it already (false: none yet); nil: read here.
local rank = {q = 1, x = 2, d = 3, a = 4}
local function move(k, uid, new, cur)
  local f = 'u:' .. uid
  if cur == nil then cur = redis.call('HGET', k, f) end
  if cur and rank[new] <= rank[cur] then return 0 end
  redis.call('HSET', k, f, new)
  redis.call('HINCRBY', k, 'c' .. new, 1)
  if cur then redis.call('HINCRBY', k, 'c' .. cur, -1) end
  return 1
end
-- `move` of a uid that most likely has no state yet (a receipt being recorded): set if
-- absent, in one command, else moved as usual (an ack may come before the record).
local function place(k, uid, new)
  if redis.call('HSETNX', k, 'u:' .. uid, new) == 1 then
    redis.call('HINCRBY', k, 'c' .. new, 1)
    return 1
  end
  return move(k, uid, new)
end
