-- The publish of one entry to a Redis Streams topic, and its trim (`redis_trim.py`).
-- KEYS: stream, lost counts. ARGV: maxlen, idle_ms, check ('1': look at the groups even
-- within the bound), max excess, lost ttl, then the entry's field/value pairs.
-- Returns {entry id, {dropped groups}, {group, unread trimmed, ...}, {push, batch, ...}}.
local fields = {}
for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
local id = redis.call('XADD', KEYS[1], '*', unpack(fields))
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
