-- A gone gateway's users (or a restarted one's from before): up to `count` of them are
-- scheduled. KEYS: the gateway's users, due, gws. ARGV: now, due, keep ms, presence
-- prefix, gateway id, count. Returns how many were taken.
-- After schedule_fn.lua.
local uids = redis.call('SPOP', KEYS[1], tonumber(ARGV[6]))
for _, uid in ipairs(uids) do schedule(KEYS[2], ARGV[4], uid, ARGV[1], ARGV[2], ARGV[3]) end
if redis.call('SCARD', KEYS[1]) == 0 then redis.call('SREM', KEYS[3], ARGV[5]) end
return #uids
