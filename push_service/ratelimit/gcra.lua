-- KEYS: the bucket. ARGV: emission interval us, tolerance us. Returns 0 (allowed) or
-- the wait in us until it would be.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local allow_at = tat - tolerance
if allow_at > now then
  return allow_at - now
end
local new_tat = tat + interval
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX',
           math.ceil((new_tat - now) / 1000) + 1)
return 0
