-- A gateway's unregisters left these users no route there: the first `n` no live route
-- anywhere (they are scheduled), the rest live routes on other gateways only. All leave
-- the gateway's set of users. KEYS: due, the gateway's users. ARGV: now, due, keep ms,
-- presence prefix, n, uid...
-- After schedule_fn.lua.
local last = 5 + tonumber(ARGV[5])
for i = 6, #ARGV do
  if i <= last then schedule(KEYS[1], ARGV[4], ARGV[i], ARGV[1], ARGV[2], ARGV[3]) end
  redis.call('SREM', KEYS[2], ARGV[i])
end
return 0
