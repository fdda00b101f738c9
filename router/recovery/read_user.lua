-- KEYS: seq, log, legacy inbox. ARGV: after's epoch and n ('' for no log: a new
-- connection, which reads the inbox only), log max. A position of another epoch reads
-- the log from its start. Returns {head n, epoch, the n the inbox starts after, the log's
-- entries from the first either part needs, the legacy inbox}: the log part is the
-- entries after `after` among the last `log max`; the inbox the entries after the acked
-- position and after the floor the inbox bound set (append_user.lua). The legacy inbox
-- is a sorted set by n, written before the inbox was the log's, read until it lapses; a
-- sequence without `a` was written only by the version before, so its log has no inbox
-- part: the legacy inbox is the whole inbox. Returned last: up to which n the legacy
-- inbox is read whole (its entries past that, only after where the inbox starts): all
-- of it for such a sequence; for one that has `a`, what was there when it got it (`m`,
-- append_user.lua), which an ack removes from it (ack.lua). What a push service of the
-- version before adds later is read only if the acked position does not cover it.
local h = redis.call('HMGET', KEYS[1], 'n', 'e', 'a', 'f', 'm')
local head = tonumber(h[1] or '0')
local e = h[2] or '0'
local from = head
if h[3] then from = math.max(tonumber(h[3]), tonumber(h[4] or '0')) end
local start = from
local whole = head
if h[3] then whole = tonumber(h[5] or '0') end
if ARGV[2] ~= '' then
  local after = e == ARGV[1] and tonumber(ARGV[2]) or 0
  from = math.min(from, math.max(after, head - tonumber(ARGV[3])))
end
local log = {}
if head > from then log = redis.call('LRANGE', KEYS[2], from - head, -1) end
return {head, e, start, log, redis.call('ZRANGE', KEYS[3], 0, -1), whole}
