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
-- and out of the inbox too (by time, on every 8th append, below). The log lives at least
-- one inbox ttl (and one window) after its last append (ack.lua shortens that to one
-- window once everything is acked), the sequence at least its seq ttl. Each TTL is set a
-- quarter longer than needed, and its deadline kept in the sequence (`x`: the sequence's,
-- `y`: the log's); an append sets it again only once it ends sooner than needed, so most
-- appends send no PEXPIRE (a quarter of a day apart, at the defaults). A log that is
-- new (a first append, or Redis lost it) always gets its TTL.
-- A sequence without `a` was written only by the version before, whose inbox was a
-- sorted set of its own (the legacy inbox): what it holds waits there, so the log's
-- inbox starts with this entry.
-- Returns {n, epoch, entries the inbox bound pushed out (0 or 1)}.
local now = tonumber(ARGV[2])
local legacy = ARGV[9] == '1'
local fields = {}  -- the sequence's fields to set, in one HSET at the end
local a = h[2]
if not a then
  a = n - 1
  table.insert(fields, 'a')
  table.insert(fields, a)
  if n > 1 then  -- `m`: the version before's inbox was the whole inbox up to here
    table.insert(fields, 'm')
    table.insert(fields, a)
  end
end
if ((not h[2] and n > 1) or legacy) and not h[6] then
  -- `l`: the version before's inbox may hold entries (ack.lua removes acked ones there):
  -- it wrote this sequence (without `a`; a new one starts at 1), or writes it still.
  table.insert(fields, 'l')
  table.insert(fields, 1)
end
local floor = math.max(tonumber(a), tonumber(h[3] or '0'))
-- Whether a key's TTL must be set again: its deadline ends sooner than needed, or lies
-- further than this append would set it (a writer whose clock is ahead), or push services
-- of the version before may run (legacy writes): they shorten TTLs and know nothing of
-- the deadlines, so each append sets them, and records none (0), so that the first
-- append after the legacy writes stop sets them again too.
local function due(deadline, needed, ttl)
  local at = tonumber(deadline or '0')
  return legacy or at < now + needed or at > now + ttl
end
local seq_ttl = tonumber(ARGV[6])
if seq_ttl > 0 then
  local ttl = seq_ttl + math.floor(seq_ttl / 4)
  if due(h[4], seq_ttl, ttl) then
    redis.call('PEXPIRE', KEYS[1], ttl)
    table.insert(fields, 'x')
    table.insert(fields, legacy and 0 or now + ttl)
  end
end
local len = redis.call('RPUSH', KEYS[2], n .. ' ' .. ARGV[2] .. ' ' .. ARGV[1])
local log_ttl = math.max(tonumber(ARGV[5]), tonumber(ARGV[8]))
local ttl = log_ttl + math.floor(log_ttl / 4)
if len == 1 or due(h[5], log_ttl, ttl) then
  redis.call('PEXPIRE', KEYS[2], ttl)
  table.insert(fields, 'y')
  table.insert(fields, legacy and 0 or now + ttl)
end
local inbox_max = tonumber(ARGV[7])
local keep = math.max(tonumber(ARGV[4]), inbox_max)
if len > keep then redis.call('LTRIM', KEYS[2], -keep, -1) end
local over = 0
if n - floor > inbox_max then
  over = 1
  floor = n - inbox_max
  table.insert(fields, 'f')
  table.insert(fields, floor)
end
if #fields > 0 then redis.call('HSET', KEYS[1], unpack(fields)) end
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
if legacy then
  -- As the version before kept it (its text starts "[n,"), bounded and expiring alike.
  redis.call('ZADD', KEYS[3], n, '[' .. n .. ',' .. string.sub(ARGV[1], 4))
  local old = redis.call('ZCARD', KEYS[3]) - inbox_max
  if old > 0 then redis.call('ZREMRANGEBYRANK', KEYS[3], 0, old - 1) end
  redis.call('PEXPIRE', KEYS[3], ARGV[8])
end
return {n, e, over}
