-- KEYS: receipt, acked HLL, delivered HLL, pending. ARGV: state, early ttl ms, '1' for a
-- slot-tagged push (else '0'), uids... After move_fn.lua.
local k, state = KEYS[1], ARGV[1]
-- Whether it is listable, whether it is recorded, and the first uid's state, in one read
-- (most marks name one).
local first = redis.call('HMGET', k, 'l', 'm', 'u:' .. ARGV[4])
local l = first[1]
if l == '0' then
  local uids = {unpack(ARGV, 4)}
  if state == 'x' then
    redis.call('HINCRBY', k, 'cx', #uids)
  else
    if state == 'a' then
      redis.call('PFADD', KEYS[2], unpack(uids))
      redis.call('SREM', KEYS[4], unpack(uids))
    end
    redis.call('PFADD', KEYS[3], unpack(uids))
  end
  local ttl = redis.call('PTTL', k)
  if ttl > 0 then
    redis.call('PEXPIRE', KEYS[2], ttl)
    redis.call('PEXPIRE', KEYS[3], ttl)
  end
  return 0
end
if not l then
  if state ~= 'a' then return 0 end
  redis.call('HSET', k, 'l', '1')
  redis.call('PEXPIRE', k, ARGV[2])
end
if ARGV[3] == '1' and not first[2] then
  -- A slot-tagged push's record is one HSET of its recipients' values over whatever is
  -- there (`router.receipts.store`): a mark before it waits beside them, in `e:<uid>`,
  -- and is read with them (`with_early`).
  local moved = 0
  for i = 4, #ARGV do
    local f = 'e:' .. ARGV[i]
    local was = redis.call('HGET', k, f)
    if not was or rank[state] > rank[was] then
      redis.call('HSET', k, f, state)
      moved = moved + 1
    end
  end
  return moved
end
local moved = move(k, ARGV[4], state, first[3])
for i = 5, #ARGV do moved = moved + move(k, ARGV[i], state) end
return moved
