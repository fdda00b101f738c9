-- KEYS: receipt, pending. ARGV: ttl ms, mode, recipients, online, listable, queued
-- (counts-only), pending ttl ms (0: none), n meta, meta k v..., then uid state pairs:
-- moved (listable), or added to the pending set (counts-only, a message.unacked due).
-- After move_fn.lua.
local k = KEYS[1]
redis.call('HSET', k, 'm', ARGV[2], 'n', ARGV[3], 'on', ARGV[4], 'l', ARGV[5])
if ARGV[5] == '0' then redis.call('HSET', k, 'cq', ARGV[6]) end
local i = 9
for _ = 1, tonumber(ARGV[8]) do
  redis.call('HSET', k, ARGV[i], ARGV[i + 1])
  i = i + 2
end
local pend = ARGV[5] == '0' and tonumber(ARGV[7]) > 0
while i < #ARGV do
  if pend then redis.call('SADD', KEYS[2], ARGV[i]) else move(k, ARGV[i], ARGV[i + 1]) end
  i = i + 2
end
if pend then redis.call('PEXPIRE', KEYS[2], ARGV[7]) end
redis.call('PEXPIRE', k, ARGV[1])
return 1
