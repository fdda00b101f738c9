-- The common head of every fenced write: ARGV[1] is the writer's epoch.
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'queued' and status ~= 'running' then return 0 end
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
