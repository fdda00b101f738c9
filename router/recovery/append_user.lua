-- After next.lua. KEYS: seq, log. ARGV: data, now, cutoff (now - window), log max, window
-- (ms), seq ttl, inbox max, inbox ttl (ms).
-- A user's log is a list of "<n> <ts> <data>", appended under the user's sequence in one
-- script, so the last element is always the head and entry n sits at index
-- -(head - n + 1). It is the user's recovery log and inbox at once: the inbox is the
-- entries after the acked position `a` (a field of the sequence, moved by ack.lua) and
-- after the floor `f` (the last entry the inbox bound pushed out, set here, so that the
-- bound is the writer's, whatever the readers' settings), younger than the inbox ttl.
-- An entry leaves the front when it is out of the recovery window (or past the log max)
-- and out of the inbox too. The log lives one inbox ttl after its last append (ack.lua
-- shortens that to one window once everything is acked).
-- Returns {n, epoch, entries the inbox bound pushed out (0 or 1)}.
local h = redis.call('HMGET', KEYS[1], 'a', 'f')
local floor = math.max(tonumber(h[1] or '0'), tonumber(h[2] or '0'))
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
local cutoff = tonumber(ARGV[3])
local inbox_cutoff = tonumber(ARGV[2]) - tonumber(ARGV[8])
for _ = 1, 4 do
  local first = redis.call('LINDEX', KEYS[2], 0)
  if not first then break end
  local fn, fts = string.match(first, '^(%d+) (%d+) ')
  fn, fts = tonumber(fn), tonumber(fts)
  if fts >= cutoff or (fn > floor and fts >= inbox_cutoff) then break end
  redis.call('LPOP', KEYS[2])
end
redis.call('PEXPIRE', KEYS[2], math.max(tonumber(ARGV[5]), tonumber(ARGV[8])))
return {n, e, over}
