-- Due entries, leased: each is due again at `lease_until` unless settled first (a sweeper
-- that dies after its claim loses nothing). KEYS: due. ARGV: now, lease_until, limit.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, m in ipairs(due) do redis.call('ZADD', KEYS[1], ARGV[2], m) end
return due
