-- KEYS: seq, inbox. ARGV: epoch, then ns (of that epoch: nothing of another is taken).
if redis.call('HGET', KEYS[1], 'e') ~= ARGV[1] then return 0 end
for i = 2, #ARGV do redis.call('ZREMRANGEBYSCORE', KEYS[2], ARGV[i], ARGV[i]) end
return #ARGV - 1
