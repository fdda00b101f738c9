"""The webhooks' Lua scripts. Every key they touch is in the ``{wh}`` hash slot
(`shared.keys`), so each script is atomic on Redis Cluster too.

A user's presence hash holds ``e``, the epoch of its newest connection, and ``r``, the
epoch last reported offline. An epoch is ``max(e + 1, now_ms)``: it grows with every new
connection, and stays above every earlier one even when the hash expired (30 days away)
or Redis lost it. The events are built here as JSON, from a uid that Python quoted.
"""

from __future__ import annotations

__all__ = ["ADOPT", "CLAIM", "CONNECTED", "EMIT", "EMPTIED", "SETTLE"]

# Adds one event unless the outbox is full; a refused one is counted in `overflow`.
_EMIT_FN = """
local function emit(stream, overflow, maxlen, json)
  if redis.call('XLEN', stream) >= maxlen then
    redis.call('INCR', overflow)
    return 0
  end
  redis.call('XADD', stream, '*', 'e', json)
  return 1
end
local function presence_event(kind, epoch, ts, quoted)
  return '{"event_id":"' .. kind .. ':' .. epoch .. ':' .. string.sub(quoted, 2, -2)
    .. '","type":"' .. kind .. '","ts":' .. ts .. ',"uid":' .. quoted
    .. ',"epoch":' .. epoch .. '}'
end
"""

# KEYS: events, overflow. ARGV: maxlen, event JSON... Returns how many were added.
EMIT = (
    _EMIT_FN
    + """
local added = 0
for i = 2, #ARGV do added = added + emit(KEYS[1], KEYS[2], tonumber(ARGV[1]), ARGV[i]) end
return added
"""
)

# New connections. KEYS: events, overflow, the gateway's users, gws. ARGV: now, keep ms,
# maxlen, presence prefix, gateway id, then (uid, quoted uid) pairs. Each gets a new
# epoch; a user reported offline gets user.online with it. Returns how many were refused.
CONNECTED = (
    _EMIT_FN
    + """
local now, maxlen, pfx = tonumber(ARGV[1]), tonumber(ARGV[3]), ARGV[4]
local refused = 0
redis.call('SADD', KEYS[4], ARGV[5])
for i = 6, #ARGV, 2 do
  local uid, quoted = ARGV[i], ARGV[i + 1]
  local p = pfx .. uid
  local e = tonumber(redis.call('HGET', p, 'e') or '0')
  local epoch = string.format('%.0f', math.max(e + 1, now))
  redis.call('HSET', p, 'e', epoch)
  if redis.call('HGET', p, 'r') then
    redis.call('HDEL', p, 'r')
    local json = presence_event('user.online', epoch, ARGV[1], quoted)
    refused = refused + 1 - emit(KEYS[1], KEYS[2], maxlen, json)
  end
  redis.call('PEXPIRE', p, ARGV[2])
  redis.call('SADD', KEYS[3], uid)
end
return refused
"""
)

# Schedules `<epoch>:<uid>` at `due`, with the user's current epoch (a user never seen
# gets one). Shared by EMPTIED and ADOPT.
_SCHEDULE_FN = """
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
"""

# A gateway's unregisters left these users no live route. KEYS: due, the gateway's
# users. ARGV: now, due, keep ms, presence prefix, uid...
EMPTIED = (
    _SCHEDULE_FN
    + """
for i = 5, #ARGV do
  schedule(KEYS[1], ARGV[4], ARGV[i], ARGV[1], ARGV[2], ARGV[3])
  redis.call('SREM', KEYS[2], ARGV[i])
end
return 0
"""
)

# A gone gateway's users (or a restarted one's from before): up to `count` of them are
# scheduled. KEYS: the gateway's users, due, gws. ARGV: now, due, keep ms, presence
# prefix, gateway id, count. Returns how many were taken.
ADOPT = (
    _SCHEDULE_FN
    + """
local uids = redis.call('SPOP', KEYS[1], tonumber(ARGV[6]))
for _, uid in ipairs(uids) do schedule(KEYS[2], ARGV[4], uid, ARGV[1], ARGV[2], ARGV[3]) end
if redis.call('SCARD', KEYS[1]) == 0 then redis.call('SREM', KEYS[3], ARGV[5]) end
return #uids
"""
)

# Due entries, leased: each is due again at `lease_until` unless settled first (a sweeper
# that dies after its claim loses nothing). KEYS: due. ARGV: now, lease_until, limit.
CLAIM = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, m in ipairs(due) do redis.call('ZADD', KEYS[1], ARGV[2], m) end
return due
"""

# Claimed entries, with each user's latest live route deadline (0: none). An entry whose
# epoch is no longer the user's is dropped (the user reconnected: fenced); one whose user
# still has a live route is checked again at that route's deadline (a crashed gateway's
# routes lapse then); otherwise user.offline is sent, once per epoch. KEYS: due, events,
# overflow. ARGV: now, keep ms, maxlen, presence prefix, then (member, quoted uid,
# deadline) triples. Returns {offline sent, fenced, checked again, refused}.
SETTLE = (
    _EMIT_FN
    + """
local maxlen, pfx = tonumber(ARGV[3]), ARGV[4]
local sent, fenced, again, refused = 0, 0, 0, 0
for i = 5, #ARGV, 3 do
  local m, quoted, live = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local c = string.find(m, ':', 1, true)
  local epoch, p = string.sub(m, 1, c - 1), pfx .. string.sub(m, c + 1)
  if redis.call('HGET', p, 'e') ~= epoch then
    redis.call('ZREM', KEYS[1], m)
    fenced = fenced + 1
  elseif live > 0 then
    redis.call('ZADD', KEYS[1], live, m)
    again = again + 1
  else
    redis.call('ZREM', KEYS[1], m)
    if redis.call('HGET', p, 'r') ~= epoch then
      local json = presence_event('user.offline', epoch, ARGV[1], quoted)
      if emit(KEYS[2], KEYS[3], maxlen, json) == 1 then
        redis.call('HSET', p, 'r', epoch)
        redis.call('PEXPIRE', p, ARGV[2])
        sent = sent + 1
      else
        refused = refused + 1
      end
    end
  end
end
return {sent, fenced, again, refused}
"""
)
