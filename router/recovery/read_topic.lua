-- KEYS: seq, log. ARGV: after's epoch and n, upto's epoch and n ('' for the head). From
-- another epoch than the log's, `after` reads from its start; an `upto` of an earlier
-- epoch reads nothing, of a later one to the head. Returns {head n, epoch, entries}.
local head = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
local e = redis.call('HGET', KEYS[1], 'e') or '0'
local after = e == ARGV[1] and tonumber(ARGV[2]) or 0
local upto = head
if ARGV[4] ~= '' and ARGV[3] == e then upto = math.min(tonumber(ARGV[4]), head) end
if ARGV[4] ~= '' and ARGV[3] ~= e and tonumber(ARGV[3]) < tonumber(e) then upto = 0 end
if upto <= after then return {head, e, {}} end
return {head, e, redis.call('LRANGE', KEYS[2], after - head, upto - head - 1)}
