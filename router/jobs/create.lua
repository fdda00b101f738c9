-- A new job, leased to its creator; the latest jobs (for the dashboard) keep it among
-- theirs. KEYS = job, running, recent. ARGV = lease end, push id, created at, recent
-- kept, create by (Redis's clock, ms), then the job's field/value pairs.
-- Run past its deadline (a Redis that was paused, with the request's 503 long sent,
-- "nothing was sent"), it creates nothing: returns 0.
local t = redis.call('TIME')
if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[5]) then
  return 0
end
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('ZADD', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -tonumber(ARGV[4]) - 1)
return 1
