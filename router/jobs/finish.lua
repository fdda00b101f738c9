-- ARGV = epoch, push id, finished TTL, failed list, then field/value pairs (status, ...).
-- What only a resume needs goes with the end (the spec holds up to 64 KiB of content,
-- and a multicast's whole `to` list).
-- After fence_fn.lua.
redis.call('HSET', KEYS[1], 'failed', ARGV[4], unpack(ARGV, 5))
redis.call('HDEL', KEYS[1], 'spec', 'checkpoint', 'released')
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('ZREM', KEYS[2], ARGV[2])
return 1
