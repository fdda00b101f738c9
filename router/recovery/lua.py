"""The recovery store's Lua scripts, read from this folder (each one's comments say
what it takes) and composed: one script's code runs inside another as a function.

Redis runs one script text per call, so a script that does what another does takes that
one's text as a local function: ``as_function("f", text)`` makes ``f(KEYS, ARGV)``, whose
body sees the keys and arguments it is called with, not the caller's.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["APPEND", "APPEND_QUEUED", "as_function", "lua"]


def lua(name: str) -> str:
    """`router/recovery/<name>.lua`."""
    return (Path(__file__).parent / f"{name}.lua").read_text(encoding="utf-8")


def as_function(name: str, text: str) -> str:
    """The script `text` as a local function `name(KEYS, ARGV)` of the script after it."""
    return f"local function {name}(KEYS, ARGV)\n{text}end\n"


# Every sequence is a hash: `n` its counter, `e` its epoch (`next.lua`, the prelude of
# every append), so a Redis that lost a log starts it again under a later epoch.
APPEND = lua("next") + lua("append")
# The append, then the entry into the inbox (`append_queued.lua` calls `append()`).
APPEND_QUEUED = "local function append()\n" + APPEND + "end\n" + lua("append_queued")
