-- Sets one connection's field and extends the key's PEXPIRE without ever shortening it;
-- first drops the fields past their own deadline among a few sampled ones. A new
-- connection (cap > 0) is refused (0) when its user already has `cap` fields, counted
-- after a sweep of up to REAP_SAMPLE of them, so only live routes count; one script, so
-- two gateways admitting the same user at once cannot both pass the check. Heartbeats
-- upsert too (cap 0), so routes come back by themselves after Redis lost its data
-- (restart, failover): 2 says the field was not there (a route lost, or lapsed), 1 that
-- it was. Every call is O(1) in the number of the user's connections.
-- KEYS: the user's routes. ARGV: conn id, route value, now ms, ttl ms, cap (0: none).
-- SWEEP_SAMPLE and REAP_SAMPLE are locals of a prelude (router.routes.registry).
local key, field, value = KEYS[1], ARGV[1], ARGV[2]
local now, ttl, cap = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local function sweep(count)
  local sample = redis.call('HRANDFIELD', key, count, 'WITHVALUES')
  for i = 1, #sample, 2 do
    local exp = tonumber(string.match(sample[i + 1], '|(%d+)$'))
    if exp and exp <= now then redis.call('HDEL', key, sample[i]) end
  end
end
sweep(SWEEP_SAMPLE)
if cap > 0 and redis.call('HEXISTS', key, field) == 0
    and redis.call('HLEN', key) >= cap then
  sweep(REAP_SAMPLE)
  if redis.call('HLEN', key) >= cap then return 0 end
end
local added = redis.call('HSET', key, field, value)
if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
return 1 + added
