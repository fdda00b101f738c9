-- Renewal and checkpoint: ARGV = epoch, lease end, push id, checkpoint or '', failed
-- list, then the counters as field/value pairs. After fence_fn.lua.
redis.call('HSET', KEYS[1], 'status', 'running', 'failed', ARGV[5], unpack(ARGV, 6))
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'checkpoint', ARGV[4]) end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
return 1
