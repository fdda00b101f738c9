-- After next.lua. KEYS: seq, log. ARGV: data, now, cutoff (now - window), maxlen, log ttl, seq ttl (0: none).
-- A log is a list of "<n> <ts> <data>", appended under its sequence in one script, so
-- the last element is always the head and entry n sits at index -(head - n + 1). A list
-- costs about 180 bytes per entry; a stream would cost 4.7 KB for its first one.
-- Returns {n, epoch}.
if tonumber(ARGV[6]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[6]) end
redis.call('RPUSH', KEYS[2], n .. ' ' .. ARGV[2] .. ' ' .. ARGV[1])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[4]), -1)
local cutoff = tonumber(ARGV[3])
for _ = 1, 4 do
  local first = redis.call('LINDEX', KEYS[2], 0)
  if not first or tonumber(string.match(first, '^%d+ (%d+) ')) >= cutoff then break end
  redis.call('LPOP', KEYS[2])
end
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return {n, e}
