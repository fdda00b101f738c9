-- After range.lua (head, e, after, upto and the budget, from KEYS[1] and ARGV).
-- KEYS: seq, log. ARGV: after's epoch and n, upto's epoch and n ('' for the head), then
-- a budget: at most ARGV[6] entries and ARGV[5] bytes of them (0: no bound). From
-- another epoch than the log's, `after` reads from its start; an `upto` of an earlier
-- epoch reads nothing, of a later one to the head. Within a budget the log is read
-- backward from `upto`, in chunks sized by what is left of the budget over the largest
-- entry seen so far (the first: one entry), and the read stops at the first entry past
-- it: a position far behind the head costs Redis about the budget and one chunk, never
-- the log. Over the budget the newest entries that fit are returned, and `from`: the n
-- after which they are all there (any position below it is over too).
-- Returns {head n, epoch, entries in order, 1 when over the budget else 0, from}.
local first, last = after - head, upto - head - 1
if max_bytes == 0 and max_entries == 0 then
  return {head, e, redis.call('LRANGE', KEYS[2], first, last), 0, after}
end
if max_bytes == 0 then max_bytes = math.huge end
local over = 0
if max_entries > 0 and upto - after > max_entries then
  first, over = last - max_entries + 1, 1
end
-- Entries trimmed away (by count or age) are not there: stop at the oldest kept.
first = math.max(first, -redis.call('LLEN', KEYS[2]))
local rev, used, widest, at, n = {}, 0, 1, last, 1
while at >= first do
  local chunk = redis.call('LRANGE', KEYS[2], math.max(first, at - n + 1), at)
  if #chunk == 0 then break end
  for i = #chunk, 1, -1 do
    local size = #chunk[i]
    if used + size > max_bytes then
      local out = {}
      for k = #rev, 1, -1 do out[#out + 1] = rev[k] end
      return {head, e, out, 1, head + at + 1}
    end
    used = used + size
    if size > widest then widest = size end
    rev[#rev + 1] = chunk[i]
    at = at - 1
  end
  n = math.max(1, math.floor((max_bytes - used) / widest))
end
local out = {}
for k = #rev, 1, -1 do out[#out + 1] = rev[k] end
return {head, e, out, over, over == 1 and head + first or after}
