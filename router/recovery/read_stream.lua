-- After range.lua (head, e, after, upto and the budget, from KEYS[1] and ARGV).
-- read_topic.lua for a topic whose log is its bus stream (the Redis Streams bus on this
-- Redis: publish.lua gives each entry its place, `attr:seq` and `attr:epoch`). KEYS:
-- seq, stream, and the list that logged the topic before (read for one release, while
-- it lasts: it lapses one window after its last append). ARGV and the reply as
-- read_topic.lua's, but each entry is three values: its n, 0 for a stream entry (the
-- batch's bytes follow) or 1 for a list entry (its text), and that.
-- Both are read backward from the end, merged by n: entries above `upto`, and a stream
-- entry without a place (a publish that logged apart, before the upgrade), are passed
-- over; the read stops at `after`, at another epoch's entries, or at the first entry
-- past the budget. A read far behind the head costs Redis about the budget and a chunk.
local over, from = 0, after
if max_entries > 0 and upto - after > max_entries then
  over, from = 1, upto - max_entries
end
if max_bytes == 0 then max_bytes = math.huge end
-- How many entries a chunk asks for: those above `upto` first, then what is left of the
-- budget over the widest entry seen (one at first when there is a byte budget), and one
-- more, which may say where the read ends.
local widest, used, seen = 1, 0, false
local function chunk(skip)
  local want = upto - from
  if max_bytes ~= math.huge then
    want = seen and math.max(1, math.floor((max_bytes - used) / widest)) or 1
  end
  return math.max(0, skip) + math.min(want, upto - from) + 1
end

-- Each source: a function giving its next entry down, {n, kind, value}, or nil at its end.
local function stream_source()
  local buf, i, cursor, done, skip = {}, 1, '+', false, head - upto
  return function()
    while true do
      if i > #buf then
        if done then return nil end
        buf = redis.call('XREVRANGE', KEYS[2], cursor, '-', 'COUNT', chunk(skip))
        i, skip = 1, 0
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
      if n then
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

local streams, lists = stream_source(), list_source()
local s, l = streams(), lists()
local rev = {}
while true do
  local pick
  if s and (not l or s[1] >= l[1]) then
    pick = s
    if l and l[1] == s[1] then l = lists() end  -- in both (a publish during the upgrade)
    s = streams()
  elseif l then
    pick = l
    l = lists()
  else
    break
  end
  local n = pick[1]
  if n <= from then break end
  if n <= upto and (#rev == 0 or rev[#rev][1] > n) then
    local size = #pick[3]
    if used + size > max_bytes then over, from = 1, n break end
    used, seen = used + size, true
    if size > widest then widest = size end
    rev[#rev + 1] = pick
  end
end
local out = {}
for k = #rev, 1, -1 do
  out[#out + 1] = rev[k][1]
  out[#out + 1] = rev[k][2]
  out[#out + 1] = rev[k][3]
end
return {head, e, out, over, from}
