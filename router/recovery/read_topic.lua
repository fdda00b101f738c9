-- KEYS: seq, log. ARGV: after's epoch and n, upto's epoch and n ('' for the head), then
-- a budget: at most ARGV[6] entries and ARGV[5] bytes of them (0: no bound). From
-- another epoch than the log's, `after` reads from its start; an `upto` of an earlier
-- epoch reads nothing, of a later one to the head. Over the budget nothing is returned:
-- the entries are read in chunks and the read stops at the first byte past it, so a
-- position far behind the head costs Redis the budget, not the log.
-- Returns {head n, epoch, entries, 1 when over the budget else 0}.
local head = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
local e = redis.call('HGET', KEYS[1], 'e') or '0'
local after = e == ARGV[1] and tonumber(ARGV[2]) or 0
local upto = head
if ARGV[4] ~= '' and ARGV[3] == e then upto = math.min(tonumber(ARGV[4]), head) end
if ARGV[4] ~= '' and ARGV[3] ~= e and tonumber(ARGV[3]) < tonumber(e) then upto = 0 end
if upto <= after then return {head, e, {}, 0} end
local max_bytes, max_entries = tonumber(ARGV[5] or '0'), tonumber(ARGV[6] or '0')
if max_entries > 0 and upto - after > max_entries then return {head, e, {}, 1} end
local first, last = after - head, upto - head - 1
if max_bytes == 0 then return {head, e, redis.call('LRANGE', KEYS[2], first, last), 0} end
-- Entries trimmed away (by count or age) are not there: start at the oldest kept.
first = math.max(first, -redis.call('LLEN', KEYS[2]))
local out, used = {}, 0
while first <= last do
  local chunk = redis.call('LRANGE', KEYS[2], first, math.min(first + 63, last))
  if #chunk == 0 then break end
  for _, entry in ipairs(chunk) do
    used = used + #entry
    if used > max_bytes then return {head, e, {}, 1} end
    out[#out + 1] = entry
  end
  first = first + 64
end
return {head, e, out, 0}
