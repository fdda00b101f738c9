-- KEYS: seq, log, legacy inbox. ARGV: epoch, n (the position a device acked up to), window
-- (ms). Moves the user's acked position `a` (the inbox is the log after it) up to n,
-- never back, and never past the head; a position of another epoch (Redis lost the log
-- it was in) moves nothing. Once everything is acked, the log only serves resumes: it
-- lapses one window after the ack (the sequence keeps its own TTL, so positions stay
-- valid), and the log's deadline `y` is cleared, so the next append sets its TTL again
-- (append_user.lua). The legacy inbox (a sorted set by n, written before the inbox was
-- the log's) loses what the position covers, where there may be one: a sequence without
-- `a` (written only by the version before) has no other inbox, and `l` marks one that
-- had a legacy inbox when it got its `a`, or legacy writes since (cleared once that
-- inbox is empty). Returns 1 if `a` moved, else 0.
local h = redis.call('HMGET', KEYS[1], 'e', 'a', 'n', 'l')
if h[1] ~= ARGV[1] then return 0 end
local head = tonumber(h[3] or '0')
local n = math.min(tonumber(ARGV[2]), head)
if not h[2] or h[4] then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', n)
  if h[4] and redis.call('EXISTS', KEYS[3]) == 0 then redis.call('HDEL', KEYS[1], 'l') end
end
if not h[2] or n <= tonumber(h[2]) then return 0 end
if n == head then
  redis.call('HSET', KEYS[1], 'a', n, 'y', 0)
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
else
  redis.call('HSET', KEYS[1], 'a', n)
end
return 1
