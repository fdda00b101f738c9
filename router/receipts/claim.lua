-- KEYS: due. ARGV: now ms, lease ms, limit. The due push ids, each leased (due again
-- at the lease's end unless settled first).
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
local until_ms = tonumber(ARGV[1]) + tonumber(ARGV[2])
for _, id in ipairs(due) do redis.call('ZADD', KEYS[1], 'XX', until_ms, id) end
return due
