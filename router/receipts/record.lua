-- KEYS: receipt, acked HLL, delivered HLL, pending. ARGV: ttl ms, mode, recipients,
-- online, listable, pending ttl ms (0: none), kept (0: a store:false push, which a
-- counts-only receipt keeps as `k`), n meta, meta k v..., then uid state pairs:
-- moved (listable), or counted (counts-only: delivered and acked in the HyperLogLogs,
-- expired in `cx`), the unacked added to the pending set while a message.unacked is due.
-- After move_fn.lua.
local k = KEYS[1]
-- A counts-only receipt's first record over marks that came before it: an early ack
-- started the receipt as listable (mark.lua), and its marks are counted below.
local early = {}
if ARGV[5] == '0' and redis.call('HEXISTS', k, 'm') == 0 then
  local held = redis.call('HGETALL', k)
  for j = 1, #held, 2 do
    if string.sub(held[j], 1, 2) == 'u:' then
      early[#early + 1] = {string.sub(held[j], 3), string.sub(held[j + 1], 1, 1)}
      redis.call('HDEL', k, held[j])
    end
  end
  -- Its expired marks stay counted in `cx`; the others are the HyperLogLogs' now.
  if #early > 0 then redis.call('HDEL', k, 'cq', 'cd', 'ca') end
end
-- Its counts and the message's fields in one HSET.
local fields = {'m', ARGV[2], 'n', ARGV[3], 'on', ARGV[4], 'l', ARGV[5]}
if ARGV[5] == '0' and ARGV[7] == '0' then
  fields[#fields + 1] = 'k'
  fields[#fields + 1] = '0'
end
local i = 9
for _ = 1, tonumber(ARGV[8]) do
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = ARGV[i + 1]
  i = i + 2
end
redis.call('HSET', k, unpack(fields))
if ARGV[5] == '1' then
  while i < #ARGV do
    place(k, ARGV[i], ARGV[i + 1])
    i = i + 2
  end
else
  local pend = tonumber(ARGV[6]) > 0
  local acked, delivered, expired = {}, {}, 0
  while i < #ARGV do
    local uid, state = ARGV[i], ARGV[i + 1]
    if state == 'a' then
      acked[#acked + 1] = uid
      redis.call('SREM', KEYS[4], uid)
    elseif pend then
      redis.call('SADD', KEYS[4], uid)
    end
    if state == 'x' then
      expired = expired + 1
    elseif state ~= 'q' then
      delivered[#delivered + 1] = uid
    end
    i = i + 2
  end
  for _, mark in ipairs(early) do
    local uid, state = mark[1], mark[2]
    if state == 'a' then
      acked[#acked + 1] = uid
      redis.call('SREM', KEYS[4], uid)
    end
    if state == 'a' or state == 'd' then delivered[#delivered + 1] = uid end
  end
  if pend then redis.call('PEXPIRE', KEYS[4], ARGV[6]) end
  if expired > 0 then redis.call('HINCRBY', k, 'cx', expired) end
  for j, uids in ipairs({acked, delivered}) do
    if #uids > 0 then
      redis.call('PFADD', KEYS[j + 1], unpack(uids))
      redis.call('PEXPIRE', KEYS[j + 1], ARGV[1])
    end
  end
end
redis.call('PEXPIRE', k, ARGV[1])
return 1
