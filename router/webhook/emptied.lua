-- A gateway's unregisters left these users no live route. KEYS: due, the gateway's
-- users. ARGV: now, due, keep ms, presence prefix, uid...
-- After schedule_fn.lua.
for i = 5, #ARGV do
  schedule(KEYS[1], ARGV[4], ARGV[i], ARGV[1], ARGV[2], ARGV[3])
  redis.call('SREM', KEYS[2], ARGV[i])
end
return 0
