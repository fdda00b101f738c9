-- The request's value is the boot it is for; taking it deletes it either way.
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
redis.call('DEL', KEYS[1])
if v == ARGV[1] then return 1 end
return 0
