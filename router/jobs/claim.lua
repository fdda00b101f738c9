-- One job whose lease the scan saw lapsed. ARGV = now, new lease end, max attempts,
-- push id, finished TTL, the error of an orphan that cannot be resumed, that of one out
-- of attempts. Returns false (live, or already ended), {0} (failed) or {epoch, spec,
-- checkpoint, mode, attempts} (claimed by the caller).
local score = redis.call('ZSCORE', KEYS[2], ARGV[4])
if not score or tonumber(score) > tonumber(ARGV[1]) then return false end
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'queued' and status ~= 'running' then
  redis.call('ZREM', KEYS[2], ARGV[4])
  return false
end
local f = redis.call('HMGET', KEYS[1], 'spec', 'attempts', 'released', 'checkpoint', 'mode')
local attempts = tonumber(f[2] or '1')
if f[3] ~= '1' then attempts = attempts + 1 end
if (not f[1]) or attempts > tonumber(ARGV[3]) then
  local reason = ARGV[6]
  if f[1] then reason = ARGV[7] end
  redis.call('HSET', KEYS[1], 'status', 'failed', 'error', reason, 'finished_at', ARGV[1])
  redis.call('HDEL', KEYS[1], 'spec', 'checkpoint', 'released')
  redis.call('EXPIRE', KEYS[1], ARGV[5])
  redis.call('ZREM', KEYS[2], ARGV[4])
  return {0}
end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'status', 'running', 'attempts', attempts, 'released', '0')
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[4])
return {epoch, f[1], f[4] or '', f[5], attempts}
