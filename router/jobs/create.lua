-- A new job, leased to its creator; the latest jobs (for the dashboard) keep it among
-- theirs. KEYS = job, running, recent. ARGV = lease end, push id, created at, recent
-- kept, then the job's field/value pairs.
redis.call('HSET', KEYS[1], unpack(ARGV, 5))
redis.call('ZADD', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -tonumber(ARGV[4]) - 1)
return 1
