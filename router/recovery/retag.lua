-- A braced uid's seq, log and inbox under their old names (tagged by the uid's SHA-1
-- hex: the very keys of the uid that is that hex), to their new names or aside. One
-- slot: every name is tagged by the hex. Runs after append_user.lua, wrapped as
-- `append_user(KEYS, ARGV)` (lua.py), so an entry is appended as the store appends a
-- message: numbered by next.lua, trimmed and expired alike, in the new log's inbox.
-- KEYS: old seq, log, inbox; new seq, log, inbox; quarantine seq, log, inbox.
-- ARGV: 'probe' (change nothing, say what a move would do), 'move' or 'quarantine';
-- then append_user's ARGV after its data: now, cutoff, log max, window, seq ttl, inbox
-- max, inbox ttl.
-- Returns {how, entries}: how 0 no old key; 1 renamed (positions stay valid); 2 merged:
-- the new keys exist already (a push came after the upgrade), so the old inbox's entries
-- are appended to the new log (whose inbox they join) under new numbers and the old
-- keys deleted (entries: how many); 3 set aside before: the quarantine keys exist, so
-- the old names hold only what the hex user got since, and nothing is done; 4 set aside
-- now: the old keys renamed to the quarantine names, nobody's (TTLs kept).
if redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3]) == 0 then return {0, 0} end
if redis.call('EXISTS', KEYS[7], KEYS[8], KEYS[9]) > 0 then return {3, 0} end
local mode = ARGV[1]
local function rename_old(offset)
  for i = 1, 3 do
    if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('RENAME', KEYS[i], KEYS[i + offset]) end
  end
end
if mode == 'quarantine' then
  rename_old(6)
  return {4, 0}
end
if redis.call('EXISTS', KEYS[4], KEYS[5], KEYS[6]) == 0 then
  if mode == 'move' then rename_old(3) end
  return {1, 0}
end
local entries = redis.call('ZRANGE', KEYS[3], 0, -1)
if mode ~= 'move' then return {2, #entries} end
local new = {KEYS[4], KEYS[5], KEYS[6]}
for _, text in ipairs(entries) do
  -- an inbox entry is "[<n>,<rest of the message>"; the store appends "[0,<rest>"
  local rest = string.sub(text, string.find(text, ',', 1, true) + 1)
  append_user(new, {'[0,' .. rest, ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]})
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return {2, #entries}
