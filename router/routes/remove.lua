-- Removes one connection's field; returns 1 when the user is left without a live route (a
-- presence event is due). Reads the remaining values only when there are few (a user
-- with more than 64 fields is taken to have a live one): O(1) like every write.
-- KEYS: the user's routes. ARGV: conn id, now ms.
local key, now = KEYS[1], tonumber(ARGV[2])
redis.call('HDEL', key, ARGV[1])
local n = redis.call('HLEN', key)
if n == 0 then return 1 end
if n > 64 then return 0 end
for _, v in ipairs(redis.call('HVALS', key)) do
  local exp = tonumber(string.match(v, '|(%d+)$'))
  if exp and exp > now then return 0 end
end
return 1
