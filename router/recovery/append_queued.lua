-- KEYS: seq, log, inbox. ARGV: as append.lua's, then the inbox's max and ttl. Runs after
-- next.lua and append.lua, wrapped as `append()` (store.py), then puts the entry (its
-- text starts "[0," for n 0: the inbox's copy carries its n) into the inbox, where it
-- stays until a device acks it. Returns {n, epoch, entries the inbox dropped}.
local r = append()
local n = r[1]
redis.call('ZADD', KEYS[3], n, '[' .. n .. ',' .. string.sub(ARGV[1], 4))
local over = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[7])
if over > 0 then redis.call('ZREMRANGEBYRANK', KEYS[3], 0, over - 1) else over = 0 end
redis.call('PEXPIRE', KEYS[3], ARGV[8])
return {n, r[2], over}
