-- Removes one connection's field; returns 1 when the user is left without a live route (a
-- presence event is due), 2 when the live routes left are all other gateways' (the user
-- leaves this gateway's set of users), 0 otherwise. Reads the remaining values only when
-- there are few (a user with more than 64 fields is taken to have a live one here): O(1)
-- like every write. KEYS: the user's routes. ARGV: conn id, now ms, this gateway's id.
local key, now, mine = KEYS[1], tonumber(ARGV[2]), ARGV[3] .. '|'
redis.call('HDEL', key, ARGV[1])
local n = redis.call('HLEN', key)
if n == 0 then return 1 end
if n > 64 then return 0 end
local verdict = 1
for _, v in ipairs(redis.call('HVALS', key)) do
  local exp = tonumber(string.match(v, '|(%d+)$'))
  if exp and exp > now then
    if string.sub(v, 1, #mine) == mine then return 0 end
    verdict = 2
  end
end
return verdict
