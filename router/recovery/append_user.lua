-- After next.lua. KEYS: seq, log, legacy inbox. ARGV: data, now, cutoff (now - window),
-- log max, window (ms), seq ttl, inbox max, inbox ttl (ms), '1' to write the legacy inbox
-- too (IMROUTE_INBOX_LEGACY_WRITES, while push services of the version before run).
-- A user's log is a list of "<n> <ts> <data>", appended under the user's sequence in one
-- script, so the last element is always the head and entry n sits at index
-- -(head - n + 1). It is the user's recovery log and inbox at once: the inbox is the
-- entries after the acked position `a` (a field of the sequence, moved by ack.lua) and
-- after the floor `f` (the last entry the inbox bound pushed out, set here, so that the
-- bound is the writer's, whatever the readers' settings), younger than the inbox ttl.
-- An entry leaves the front when it is out of the recovery window (or past the log max)
-- and out of the inbox too (by time, on every 8th append, below). The log lives one
-- inbox ttl after its last append (ack.lua shortens that to one window once everything
-- is acked).
-- A sequence without `a` was written only by the version before, whose inbox was a
-- sorted set of its own (the legacy inbox): what it holds waits there, so the log's
-- inbox starts with this entry.
-- Returns {n, epoch, entries the inbox bound pushed out (0 or 1)}.
local a = h[2]
if not a then
  a = n - 1
  redis.call('HSET', KEYS[1], 'a', a)
end
local floor = math.max(tonumber(a), tonumber(h[3] or '0'))
if tonumber(ARGV[6]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[6]) end
local len = redis.call('RPUSH', KEYS[2], n .. ' ' .. ARGV[2] .. ' ' .. ARGV[1])
local inbox_max = tonumber(ARGV[7])
local keep = math.max(tonumber(ARGV[4]), inbox_max)
if len > keep then redis.call('LTRIM', KEYS[2], -keep, -1) end
local over = 0
if n - floor > inbox_max then
  over = 1
  floor = n - inbox_max
  redis.call('HSET', KEYS[1], 'f', floor)
end
-- The trim by time runs on every 8th append (up to 32 entries), not on each: readers
-- filter by time themselves (the window, the inbox ttl), so what it leaves for a few
-- appends more is memory only, and most appends save its LINDEX.
if n % 8 == 0 then
  local cutoff = tonumber(ARGV[3])
  local inbox_cutoff = tonumber(ARGV[2]) - tonumber(ARGV[8])
  for _ = 1, 32 do
    local first = redis.call('LINDEX', KEYS[2], 0)
    if not first then break end
    local fn, fts = string.match(first, '^(%d+) (%d+) ')
    fn, fts = tonumber(fn), tonumber(fts)
    if fts >= cutoff or (fn > floor and fts >= inbox_cutoff) then break end
    redis.call('LPOP', KEYS[2])
  end
end
redis.call('PEXPIRE', KEYS[2], math.max(tonumber(ARGV[5]), tonumber(ARGV[8])))
if ARGV[9] == '1' then
  -- As the version before kept it (its text starts "[n,"), bounded and expiring alike.
  redis.call('ZADD', KEYS[3], n, '[' .. n .. ',' .. string.sub(ARGV[1], 4))
  local old = redis.call('ZCARD', KEYS[3]) - inbox_max
  if old > 0 then redis.call('ZREMRANGEBYRANK', KEYS[3], 0, old - 1) end
  redis.call('PEXPIRE', KEYS[3], ARGV[8])
end
return {n, e, over}
