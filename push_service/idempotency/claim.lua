-- ARGV: fingerprint, token, lease ms. Returns {"claimed"} | {"mismatch"} | {"running"}
-- | {"done", status, body}.
local e = redis.call('HMGET', KEYS[1], 'fp', 'state', 'status', 'body')
if not e[1] then
  redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'state', 'running', 'token', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {'claimed'}
end
if e[1] ~= ARGV[1] then return {'mismatch'} end
if e[2] == 'done' then return {'done', e[3], e[4]} end
return {'running'}
