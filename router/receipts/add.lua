-- KEYS: receipt. ARGV: ttl ms, mode, recipients, online, queued (added to the counts).
local k = KEYS[1]
redis.call('HSET', k, 'm', ARGV[2], 'l', '0')
redis.call('HINCRBY', k, 'n', ARGV[3])
redis.call('HINCRBY', k, 'on', ARGV[4])
redis.call('HINCRBY', k, 'cq', ARGV[5])
if redis.call('PTTL', k) < 0 then redis.call('PEXPIRE', k, ARGV[1]) end
return 1
