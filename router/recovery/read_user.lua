-- KEYS: seq, log, inbox. ARGV: after's epoch and n ('' for no log). A position of another
-- epoch reads the log from its start. Returns {head n, epoch, log, inbox}.
local head = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
local e = redis.call('HGET', KEYS[1], 'e') or '0'
local log = {}
if ARGV[2] ~= '' then
  local after = e == ARGV[1] and tonumber(ARGV[2]) or 0
  if head > after then log = redis.call('LRANGE', KEYS[2], after - head, -1) end
end
return {head, e, log, redis.call('ZRANGE', KEYS[3], 0, -1)}
