-- The prelude of read_topic.lua and read_stream.lua: which part of a topic's log a read
-- wants. KEYS[1]: the topic's sequence; ARGV: after's epoch and n, upto's ('' for the
-- head), max bytes, max entries. Sets head, e, after, upto, max_bytes and max_entries,
-- and returns at once when nothing is wanted.
local head = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
local e = redis.call('HGET', KEYS[1], 'e') or '0'
local after = e == ARGV[1] and tonumber(ARGV[2]) or 0
local upto = head
if ARGV[4] ~= '' and ARGV[3] == e then upto = math.min(tonumber(ARGV[4]), head) end
if ARGV[4] ~= '' and ARGV[3] ~= e and tonumber(ARGV[3]) < tonumber(e) then upto = 0 end
if upto <= after then return {head, e, {}, 0, after} end
local max_bytes, max_entries = tonumber(ARGV[5] or '0'), tonumber(ARGV[6] or '0')
