-- Moves one uid to a state if that is up from where it is, keeping the counters. `cur`:
-- its value if the caller read it already (false: none yet); nil: read here. A value is
-- the state, then (a slot-tagged push's receipt, `router.receipts.store`) the
-- recipient's position, kept while the state can still be derived from it.
local rank = {q = 1, x = 2, d = 3, a = 4}
local function move(k, uid, new, cur)
  local f = 'u:' .. uid
  if cur == nil then cur = redis.call('HGET', k, f) end
  local was = cur and string.sub(cur, 1, 1)
  if was and rank[new] <= rank[was] then return 0 end
  local v = new
  if cur and #cur > 1 and new ~= 'a' then v = new .. string.sub(cur, 2) end
  redis.call('HSET', k, f, v)
  redis.call('HINCRBY', k, 'c' .. new, 1)
  if was then redis.call('HINCRBY', k, 'c' .. was, -1) end
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
