"""The recovery store's Lua scripts, read from this folder (each one's comments say
what it takes) and composed: one script's code runs inside another as a function.

Redis runs one script text per call, so a script that does what another does takes that
one's text as a local function (`router.redis.scripts.as_function`).
"""

from __future__ import annotations

from router.redis.scripts import Script, as_function, lua

__all__ = ["APPEND", "APPEND_QUEUED", "FORGET", "HEAD", "QUEUE", "READ_TOPIC", "READ_USER", "RETAG"]

# Every sequence is a hash: `n` its counter, `e` its epoch (`next.lua`, the prelude of
# every append), so a Redis that lost a log starts it again under a later epoch.
_APPEND = lua(__package__, "next") + lua(__package__, "append")
# The append, then the entry into the inbox (`append_queued.lua` calls `append()`).
_APPEND_QUEUED = "local function append()\n" + _APPEND + "end\n" + lua(__package__, "append_queued")

APPEND = Script(_APPEND)
APPEND_QUEUED = Script(_APPEND_QUEUED)
QUEUE = Script.load(__package__, "queue")
READ_USER = Script.load(__package__, "read_user")
FORGET = Script.load(__package__, "forget")
READ_TOPIC = Script.load(__package__, "read_topic")
HEAD = Script.load(__package__, "head")
RETAG = Script.load(__package__, "retag", prelude=as_function("append_queued", _APPEND_QUEUED))
