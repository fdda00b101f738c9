-- KEYS: receipt, pending. ARGV: ttl ms, mode, recipients, online, listable, queued
-- (counts-only), pending ttl ms (0: none), n meta, meta k v..., then uid state pairs:
-- moved (listable), or added to the pending set (counts-only, a message.unacked due).
-- After move_fn.lua.
local k = KEYS[1]
-- Its counts and the message's fields in one HSET.
local fields = {'m', ARGV[2], 'n', ARGV[3], 'on', ARGV[4], 'l', ARGV[5]}
if ARGV[5] == '0' then
  fields[#fields + 1] = 'cq'
  fields[#fields + 1] = ARGV[6]
end
local i = 9
for _ = 1, tonumber(ARGV[8]) do
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = ARGV[i + 1]
  i = i + 2
end
redis.call('HSET', k, unpack(fields))
local pend = ARGV[5] == '0' and tonumber(ARGV[7]) > 0
while i < #ARGV do
  if pend then redis.call('SADD', KEYS[2], ARGV[i]) else place(k, ARGV[i], ARGV[i + 1]) end
  i = i + 2
end
if pend then redis.call('PEXPIRE', KEYS[2], ARGV[7]) end
redis.call('PEXPIRE', k, ARGV[1])
return 1
