-- After range.lua (head, e, after, upto and the budget, from KEYS[1] and ARGV).
-- read_topic.lua for a topic whose log is its bus stream (the Redis Streams bus on this
-- Redis: publish.lua gives each logged entry its place, `attr:seq` and `attr:epoch`).
-- KEYS: seq, stream, and the list the topic is logged in apart (by a push service of the
-- version before, or one upgrading with IMROUTE_TOPIC_LOG_LEGACY_WRITES; it lapses one
-- window after its last append). ARGV and the reply as read_topic.lua's, but each entry
-- is three values: its n, 0 for a stream entry (the batch's bytes follow) or 1 for a
-- list entry (its text), and that.
-- Both are read backward from the end, merged by n, each n once: entries above `upto`,
-- and stream entries without a place (at most once, or logged apart in the list), are
-- passed over; the read stops at the entry right after `after`, at another epoch's
-- entries, or at the first entry past the budget. A read far behind the head costs Redis
-- about the budget and a chunk; one that ends below the head also reads the entries
-- above its end (a stream is not read by position: each one passed over is read, not
-- held), where the list reads its range by index. A gateway's reads end at its mark,
-- which trails the head by what is in flight.
local over, from = 0, after
if max_entries > 0 and upto - after > max_entries then
  over, from = 1, upto - max_entries
end
if max_bytes == 0 then max_bytes = math.huge end
-- How many entries a chunk asks for: those above `upto` first (SKIP_CHUNK at a time: Lua
-- holds little of what it passes over), then what is left of the budget over the widest
-- entry seen (one at first when there is a byte budget), and one more, which may say
-- where the read ends.
local SKIP_CHUNK = 8
local widest, used, seen = 1, 0, false
local function chunk(skip)
  if skip > 0 then return math.min(skip, SKIP_CHUNK) end
  local want = upto - from
  if max_bytes ~= math.huge then
    want = seen and math.max(1, math.floor((max_bytes - used) / widest)) or 1
  end
  return math.min(want, upto - from) + 1
end

-- Each source: a function giving its next entry down, {n, kind, value}, or nil at its end.
local function stream_source()
  local buf, i, cursor, done, skip = {}, 1, '+', false, head - upto
  return function()
    while true do
      if i > #buf then
        if done then return nil end
        buf = redis.call('XREVRANGE', KEYS[2], cursor, '-', 'COUNT', chunk(skip))
        i, skip = 1, math.max(0, skip - #buf)
        if #buf == 0 then done = true return nil end
        cursor = '(' .. buf[#buf][1]
      end
      local entry = buf[i]
      i = i + 1
      local f = entry[2]
      local n, ep, data = nil, nil, nil
      for k = 1, #f, 2 do
        local name = f[k]
        if name == 'attr:seq' then n = tonumber(f[k + 1])
        elseif name == 'attr:epoch' then ep = f[k + 1]
        elseif name == 'data' then data = f[k + 1] end
      end
      if n and data then
        if ep ~= e then done = true return nil end  -- an earlier epoch's, and all below it
        return {n, 0, data}
      end
    end
  end
end

local function list_source()
  local at, first = -1, -redis.call('LLEN', KEYS[3])
  local buf, i = {}, 0
  return function()
    if i < 1 then
      if at < first then return nil end
      buf = redis.call('LRANGE', KEYS[3], math.max(first, at - chunk(0) + 1), at)
      at = at - #buf
      i = #buf
      if i < 1 then return nil end
    end
    local text = buf[i]
    i = i - 1
    return {tonumber(string.match(text, '^(%d+) ')), 1, text}
  end
end

-- Merged, newest first; each source is read on only when its last entry was taken, and
-- the read ends at the entry right after `from` (the sequence is dense).
local streams, lists = stream_source(), list_source()
local s, l = streams(), lists()
local rev, lowest, ended = {}, nil, true
while s or l do
  local pick
  if s and (not l or s[1] >= l[1]) then
    pick, s = s, false
  else
    pick, l = l, false
  end
  local n = pick[1]
  if n <= from then ended = false break end
  if n <= upto and (not lowest or n < lowest) then
    local size = #pick[3]
    if used + size > max_bytes then over, from, ended = 1, n, false break end
    used, seen, lowest = used + size, true, n
    if size > widest then widest = size end
    rev[#rev + 1] = pick
    if n == from + 1 then ended = false break end
  end
  if s == false then s = streams() end
  if l == false then l = lists() end
end
-- Over the entry budget, and the log ran out first (trimmed): all that is there comes
-- after `from` (as read_topic.lua says of a list shorter than the budget).
if over == 1 and ended then from = lowest and lowest - 1 or upto end
local out = {}
for k = #rev, 1, -1 do
  out[#out + 1] = rev[k][1]
  out[#out + 1] = rev[k][2]
  out[#out + 1] = rev[k][3]
end
return {head, e, out, over, from}
