-- A hand-over at shutdown: the epoch moves on, so a renewal of this holder still in
-- flight is refused, and the job is claimable at once (lease end 0).
-- ARGV = epoch, push id, checkpoint or '', failed list, then counter pairs.
-- After fence_fn.lua.
redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'status', 'queued', 'released', '1', 'failed', ARGV[4], unpack(ARGV, 5))
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'checkpoint', ARGV[3]) end
redis.call('ZADD', KEYS[2], 0, ARGV[2])
return 1
