"""The recovery store's Lua scripts, read from this folder (each one's comments say
what it takes) and composed: one script's code runs inside another as a function.

Redis runs one script text per call, so a script that does what another does takes that
one's text as a local function (`router.redis.scripts.as_function`).
"""

from __future__ import annotations

from router.redis.scripts import Script, as_function, lua

__all__ = [
    "ACK",
    "APPEND",
    "APPEND_USER",
    "HEAD",
    "READ_STREAM",
    "READ_TOPIC",
    "READ_USER",
    "RETAG",
]

# Every sequence is a hash: `n` its counter, `e` its epoch (`next.lua`, the prelude of
# every append), so a Redis that lost a log starts it again under a later epoch.
_NEXT = lua(__package__, "next")
# A topic's batch log, and a user's log (which is the user's inbox too).
_APPEND_USER = _NEXT + lua(__package__, "append_user")

APPEND = Script(_NEXT + lua(__package__, "append"))
APPEND_USER = Script(_APPEND_USER)
READ_USER = Script.load(__package__, "read_user")
ACK = Script.load(__package__, "ack")
READ_TOPIC = Script.load(__package__, "range", "read_topic")
READ_STREAM = Script.load(__package__, "range", "read_stream")  # a topic log that is its bus stream
HEAD = Script.load(__package__, "head")
RETAG = Script.load(__package__, "retag", prelude=as_function("append_user", _APPEND_USER))
