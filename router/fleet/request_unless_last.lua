-- KEYS[1] the drain key asked for, KEYS[2..] the others' (one hash slot: shared.keys);
-- ARGV[1] the TTL, ARGV[2] the boot asked for, ARGV[i + 1] the boot of KEYS[i]. Another
-- counts as asked while its request waits or after it took it ('<boot>!', take.lua).
for i = 2, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if v ~= ARGV[i + 1] and v ~= ARGV[i + 1] .. '!' then
    redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[1])
    return 1
  end
end
return 0
