-- Redis's own clock, in ms, on the node of KEYS[1] (the job's): what a creation's
-- deadline is set by, so that the push service's clock is not compared with Redis's.
local t = redis.call('TIME')
return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
