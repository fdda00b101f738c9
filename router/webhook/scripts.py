"""The webhooks' Lua scripts, read from this folder (each one's comments say what it
takes; a `_fn` file is a prelude of functions). Every key they touch is in the ``{wh}``
hash slot (`shared.keys`), so each script is atomic on Redis Cluster too.

A user's presence hash holds ``e``, the epoch of its newest connection, and ``r``, the
epoch last reported offline. An epoch is ``max(e + 1, now_ms)``: it grows with every new
connection, and stays above every earlier one even when the hash expired (30 days away)
or Redis lost it. The events are built here as JSON, from a uid that Python quoted.
"""

from __future__ import annotations

from router.redis.scripts import Script

__all__ = ["ADOPT", "CLAIM", "CONNECTED", "EMIT", "EMPTIED", "SETTLE"]

EMIT = Script.load(__package__, "emit_fn", "emit")
CONNECTED = Script.load(__package__, "emit_fn", "connected")
EMPTIED = Script.load(__package__, "schedule_fn", "emptied")
ADOPT = Script.load(__package__, "schedule_fn", "adopt")
CLAIM = Script.load(__package__, "claim")
SETTLE = Script.load(__package__, "emit_fn", "settle")
