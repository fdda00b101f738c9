-- The publish of one entry to a Redis Streams topic, and its trim (`redis_trim.py`).
-- KEYS: stream, lost counts, and the topic's sequence when the stream is the topic's
-- recovery log too. ARGV: maxlen, idle_ms, check ('1': look at the groups even within
-- the bound), max excess, lost ttl, the log's window in ms and its bound in entries
-- (both unused without the sequence), then the entry's field/value pairs.
-- Returns {entry id, {dropped groups}, {group, unread trimmed, ...}, {push, batch, ...}}.
local fields = {}
local batch_id, ask = nil, nil
for i = 8, #ARGV, 2 do
  local name, value = ARGV[i], ARGV[i + 1]
  if name == 'attr:seq' and value == 'next' then
    ask = #fields + 2
  elseif name == 'attr:batch_id' then
    batch_id = value
  end
  fields[#fields + 1] = name
  fields[#fields + 1] = value
end
-- As the topic's log: an entry that asks for its place (`attr:seq` 'next', from a
-- publisher that logs the batch) gets it under the topic's sequence, in this script
-- (next.lua's counter and epoch: `attr:seq`, `attr:epoch`), so the stream's order is
-- the log's. An entry that does not ask (at most once) has no place and is no part of
-- the log. A placed batch published again at once (a hedge, a retry whose first attempt
-- got through) is the entry it already is, while it is the topic's last.
if ask and not KEYS[3] then
  table.remove(fields, ask)
  table.remove(fields, ask - 1)
  ask = nil
end
local e = nil
if ask then
  local last = redis.call('HMGET', KEYS[3], 'b', 'i', 'e')
  if batch_id and last[1] == batch_id and last[2] then return {last[2], {}, {}, {}} end
  fields[ask] = redis.call('HINCRBY', KEYS[3], 'n', 1)
  e = last[3]
  if not e then
    local t = redis.call('TIME')
    e = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
    redis.call('HSET', KEYS[3], 'e', e)
  end
  fields[#fields + 1] = 'attr:epoch'
  fields[#fields + 1] = e
end
local id = redis.call('XADD', KEYS[1], '*', unpack(fields))
if KEYS[3] then
  if ask and batch_id then
    redis.call('HSET', KEYS[3], 'b', batch_id, 'i', id)
  else
    redis.call('HDEL', KEYS[3], 'b', 'i')  -- another batch is the topic's last now
  end
end
local maxlen = tonumber(ARGV[1])
if ARGV[3] ~= '1' and redis.call('XLEN', KEYS[1]) <= maxlen then return {id, {}, {}, {}} end

local function parse(s)
  local ms, seq = string.match(s, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function before(ams, aseq, bms, bseq)
  return ams < bms or (ams == bms and aseq < bseq)
end
local function fmt(ms, seq) return string.format('%.0f-%.0f', ms, seq) end
local function map(flat)
  local m = {}
  for i = 1, #flat, 2 do m[flat[i]] = flat[i + 1] end
  return m
end

-- Nothing live: only the new entry stays.
local floor_ms, floor_seq = parse(id)
local live, dropped = {}, {}
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local info = map(g)
  local idle = nil
  for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], info['name'])) do
    local ci = map(c)
    if idle == nil or ci['idle'] < idle then idle = ci['idle'] end
  end
  if idle == nil or idle > tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DESTROY', KEYS[1], info['name'])
    dropped[#dropped + 1] = info['name']
  else
    local ms, seq = parse(info['last-delivered-id'])
    local need_ms, need_seq = ms, seq + 1
    if info['pending'] > 0 then
      need_ms, need_seq = parse(redis.call('XPENDING', KEYS[1], info['name'])[2])
    end
    if before(need_ms, need_seq, floor_ms, floor_seq) then
      floor_ms, floor_seq = need_ms, need_seq
    end
    live[#live + 1] = {info['name'], ms, seq, 0}
  end
end
-- As the topic's log, the stream keeps what a resume may read too: the entries of the
-- last window, at most the log's bound of them (the oldest past it go, MAX_EXCESS at a
-- time), whether or not every live group has read them.
if KEYS[3] then
  local keep_ms, keep_seq = parse(id)
  keep_ms, keep_seq = math.max(0, keep_ms - tonumber(ARGV[6])), 0
  local over = redis.call('XLEN', KEYS[1]) - tonumber(ARGV[7])
  if over > 0 then
    local old = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', math.min(over, tonumber(ARGV[4])))
    local oms, oseq = parse(old[#old][1])
    if before(keep_ms, keep_seq, oms, oseq + 1) then keep_ms, keep_seq = oms, oseq + 1 end
  end
  if before(keep_ms, keep_seq, floor_ms, floor_seq) then floor_ms, floor_seq = keep_ms, keep_seq end
end
redis.call('XTRIM', KEYS[1], 'MINID', '~', fmt(floor_ms, floor_seq))

local excess = redis.call('XLEN', KEYS[1]) - maxlen
if excess <= 0 then return {id, dropped, {}, {}} end
if excess > tonumber(ARGV[4]) then excess = tonumber(ARGV[4]) end
local old = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', excess)
local first, last = old[1][1], old[#old][1]
for _, g in ipairs(live) do
  -- Entries handed out and not acked: the gateway has to read them again if it stalled
  -- or restarted, and would find them gone. Lost too, counted once (as they go).
  g[5] = {}
  for _, p in ipairs(redis.call('XPENDING', KEYS[1], g[1], first, last, excess)) do
    g[5][p[1]] = true
  end
end
local batches = {}
for _, e in ipairs(old) do
  local ems, eseq = parse(e[1])
  local unread = false
  for _, g in ipairs(live) do
    if before(g[2], g[3], ems, eseq) or g[5][e[1]] then
      g[4] = g[4] + 1
      unread = true
    end
  end
  if unread then
    local f = map(e[2])
    batches[#batches + 1] = f['attr:push_id'] or ''
    batches[#batches + 1] = f['attr:batch_id'] or ''
  end
end
local lms, lseq = parse(last)
redis.call('XTRIM', KEYS[1], 'MINID', '=', fmt(lms, lseq + 1))
local lost = {}
for _, g in ipairs(live) do
  if g[4] > 0 then
    redis.call('HINCRBY', KEYS[2], g[1], g[4])
    lost[#lost + 1] = g[1]
    lost[#lost + 1] = g[4]
  end
end
if #lost > 0 then redis.call('PEXPIRE', KEYS[2], ARGV[5]) end
return {id, dropped, lost, batches}
