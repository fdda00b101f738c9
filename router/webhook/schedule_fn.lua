-- Schedules `<epoch>:<uid>` at `due`, with the user's current epoch (a user never seen
-- gets one). The prelude of emptied.lua and adopt.lua.
local function schedule(due_key, pfx, uid, now, due, keep)
  local p = pfx .. uid
  local e = redis.call('HGET', p, 'e')
  if not e then
    e = now
    redis.call('HSET', p, 'e', e)
    redis.call('PEXPIRE', p, keep)
  end
  redis.call('ZADD', due_key, due, e .. ':' .. uid)
end
