"""The `pos` of a push frame: where a connection stands in each recovery log of its user.

A user's messages come from four logs (`router.recovery` keeps them):

- ``p``: the user's own P2P log (one dense sequence per user);
- ``b``: the broadcast topic's batch log (one dense sequence for the fleet);
- ``o``: the log of multicast recipients who had no route when their multicast was
  resolved (read on resume only; no gateway delivers it live);
- ``g`` in ``group``: the batch log of the gateway group the connection was in.

A position is the highest entry of each log that the connection was written (0: none).
Resuming from it replays, per log, what comes after. Its text is
``1~<p>~<b>~<o>~<group>~<g>``: URL-safe (RFC 3986 unreserved characters), at most 256
characters, and meaningless for another user, because each replay reads the resuming
user's own P2P log and only those batches that list that user.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shared.keys import ID_PATTERN

__all__ = ["MAX_POS_CHARS", "Pos", "decode_pos", "encode_pos"]

MAX_POS_CHARS = 256
_VERSION = "1"
_INT = r"(0|[1-9][0-9]{0,17})"  # below 2**63, no leading zeros: one text per position
_POS = re.compile(rf"{_VERSION}~{_INT}~{_INT}~{_INT}~({ID_PATTERN.pattern})?~{_INT}")


@dataclass(frozen=True, slots=True)
class Pos:
    p: int = 0
    b: int = 0
    o: int = 0
    group: str = ""
    g: int = 0


def encode_pos(p: int, b: int, o: int, group: str, g: int) -> str:
    """The text of a position (the components as the connection holds them)."""
    return f"{_VERSION}~{p}~{b}~{o}~{group}~{g}"


def decode_pos(text: str | None) -> Pos | None:
    """The position `text` names, or None when it is absent, too long or not ours."""
    if not text or len(text) > MAX_POS_CHARS:
        return None
    m = _POS.fullmatch(text)
    if m is None:
        return None
    p, b, o, group, g = m.groups()
    return Pos(int(p), int(b), int(o), group or "", int(g))
