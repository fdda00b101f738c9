-- The request's value is the boot it is for. Taking it marks it taken ('<boot>!', its
-- TTL kept) rather than deleting it: until the gateway's fleet record says draining, its
-- taken request still counts as one (request_unless_last.lua), so the last gateway of
-- its group cannot be asked to drain in between. Taken once per boot; a request for
-- another boot is dropped.
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
if v == ARGV[1] then
  redis.call('SET', KEYS[1], v .. '!', 'KEEPTTL')
  return 1
end
if v ~= ARGV[1] .. '!' then redis.call('DEL', KEYS[1]) end
return 0
