-- KEYS: seq, inbox. ARGV: epoch, n, data, max, ttl. Returns how many old entries were
-- dropped; nothing is written when the sequence is no longer of that epoch (Redis lost
-- the log the entry was numbered in: its n would name another message).
if redis.call('HGET', KEYS[1], 'e') ~= ARGV[1] then return 0 end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[4])
if over > 0 then redis.call('ZREMRANGEBYRANK', KEYS[2], 0, over - 1) else over = 0 end
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return over
