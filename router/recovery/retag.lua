-- A braced uid's seq, log and inbox, from their old names to their new ones (one slot:
-- both are tagged by the uid's SHA-1). KEYS: old seq, log, inbox; new seq, log, inbox.
-- ARGV: dry run ('1': change nothing), log ttl, seq ttl, log max, inbox max, inbox ttl.
-- Returns {how, entries}: how 0 nothing to move, 1 renamed (positions stay valid), 2
-- merged: the new keys exist already (a push came after the upgrade), so the old
-- inbox's entries are appended to the new log and inbox under new numbers, and the old
-- keys are deleted; entries is how many were appended.
if redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3]) == 0 then return {0, 0} end
local dry = ARGV[1] == '1'
if redis.call('EXISTS', KEYS[4], KEYS[5], KEYS[6]) == 0 then
  if not dry then
    for i = 1, 3 do
      if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('RENAME', KEYS[i], KEYS[i + 3]) end
    end
  end
  return {1, 0}
end
local entries = redis.call('ZRANGE', KEYS[3], 0, -1)
if dry then return {2, #entries} end
if not redis.call('HGET', KEYS[4], 'e') then
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[4], 'e', tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
end
local t = redis.call('TIME')
local now = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
for _, text in ipairs(entries) do
  -- an inbox entry is "[<n>,<rest of the message>", its log entry "<n> <ts> [0,<rest>"
  local rest = string.sub(text, string.find(text, ',', 1, true) + 1)
  local n = redis.call('HINCRBY', KEYS[4], 'n', 1)
  redis.call('RPUSH', KEYS[5], n .. ' ' .. now .. ' [0,' .. rest)
  redis.call('ZADD', KEYS[6], n, '[' .. n .. ',' .. rest)
end
if #entries > 0 then
  redis.call('LTRIM', KEYS[5], -tonumber(ARGV[4]), -1)
  redis.call('PEXPIRE', KEYS[5], ARGV[2])
  local over = redis.call('ZCARD', KEYS[6]) - tonumber(ARGV[5])
  if over > 0 then redis.call('ZREMRANGEBYRANK', KEYS[6], 0, over - 1) end
  redis.call('PEXPIRE', KEYS[6], ARGV[6])
  redis.call('PEXPIRE', KEYS[4], ARGV[3])
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return {2, #entries}
