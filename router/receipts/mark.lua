-- KEYS: receipt, acked HLL, delivered HLL, pending. ARGV: state, early ttl ms, uids...
-- After move_fn.lua.
local k, state = KEYS[1], ARGV[1]
-- Whether it is listable, and the first uid's state, in one read (most marks name one).
local first = redis.call('HMGET', k, 'l', 'u:' .. ARGV[3])
local l = first[1]
if l == '0' then
  local uids = {unpack(ARGV, 3)}
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
local moved = move(k, ARGV[3], state, first[2])
for i = 4, #ARGV do moved = moved + move(k, ARGV[i], state) end
return moved
