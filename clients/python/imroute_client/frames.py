"""The frames a gateway sends, read into small frozen dataclasses (pure).

- `{"type":"push","msg_id","push_id","msg_type","from","content","ts"[,"pos"][,"recovered"]}`
- `{"type":"reconnect","reason"}`: the gateway drains; its close (4503) follows
- `{"type":"recovered","count","complete"}`: the end of a replay (with the recovery work)
- anything else (`pong`, types added later) is `Unknown`, and ignored by the client
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from imroute_client.errors import ProtocolError

__all__ = ["Frame", "Message", "Reconnect", "Recovered", "Unknown", "parse_frame"]

MAX_POS = 256


@dataclass(frozen=True, slots=True)
class Message:
    """One push. `pos` is its place in the user's recovery log (None from servers that
    do not send one); `recovered` is True when it was replayed on a resume. `conn` and
    `number` (which of the client's connections it came on, and its place there) are
    the client's, for `ImrouteClient.ack`; they take no part in equality."""

    msg_id: str
    push_id: str
    msg_type: int
    sender: str
    content: Any
    ts: int
    pos: str | None = None
    recovered: bool = False
    conn: int = field(default=0, compare=False, repr=False)
    number: int = field(default=0, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Reconnect:
    """The gateway asks the client to reconnect elsewhere (a drain)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Recovered:
    """The end of a resume: `count` messages replayed; `complete` False means some may be
    missing (out of the recovery window, or an unknown `since`): resync from your store."""

    count: int
    complete: bool


@dataclass(frozen=True, slots=True)
class Unknown:
    """A frame type this client does not know."""

    type: str | None


Frame = Message | Reconnect | Recovered | Unknown


def parse_frame(data: str | bytes) -> Frame:
    """Read one text frame; raise ProtocolError when it breaks the protocol."""
    try:
        frame: Any = json.loads(data)
    except ValueError:
        raise ProtocolError("a frame that is not JSON") from None
    if not isinstance(frame, dict):
        raise ProtocolError("a frame that is not a JSON object")
    kind = frame.get("type")
    if kind == "push":
        return _message(frame)
    if kind == "reconnect":
        reason = frame.get("reason")
        return Reconnect(reason if isinstance(reason, str) else "")
    if kind == "recovered":
        count, complete = frame.get("count"), frame.get("complete")
        if not _is_int(count) or not isinstance(complete, bool):
            raise ProtocolError(f"a recovered frame without count and complete: {frame!r:.200}")
        return Recovered(count, complete)
    return Unknown(kind if isinstance(kind, str) else None)


def _message(frame: dict[str, Any]) -> Message:
    msg_id, push_id, sender = frame.get("msg_id"), frame.get("push_id"), frame.get("from")
    msg_type, ts, pos = frame.get("msg_type"), frame.get("ts"), frame.get("pos")
    if not (isinstance(msg_id, str) and msg_id and isinstance(push_id, str)):
        raise ProtocolError(f"a push without msg_id or push_id: {frame!r:.200}")
    if not (isinstance(sender, str) and _is_int(msg_type) and _is_int(ts)):
        raise ProtocolError(f"a push without from, msg_type or ts: {frame!r:.200}")
    if pos is not None and not (isinstance(pos, str) and 0 < len(pos) <= MAX_POS):
        raise ProtocolError(f"a push whose pos is not a string of 1-{MAX_POS} characters")
    return Message(
        msg_id=msg_id,
        push_id=push_id,
        msg_type=msg_type,
        sender=sender,
        content=frame.get("content"),
        ts=ts,
        pos=pos,
        recovered=frame.get("recovered") is True,
    )


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
