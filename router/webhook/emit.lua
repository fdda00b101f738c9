-- KEYS: events, overflow. ARGV: maxlen, event JSON... Returns how many were added.
-- After emit_fn.lua.
local added = 0
for i = 2, #ARGV do added = added + emit(KEYS[1], KEYS[2], tonumber(ARGV[1]), ARGV[i]) end
return added
