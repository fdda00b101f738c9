"""A push body checked by hand, for the hot path: the common, canonical shape only.

`PushIn` (pydantic) is the contract; this is a shortcut that accepts a strict subset of
what it accepts, with the same resulting values, in about a tenth of the time. Whatever
it does not recognise at once (a key spelt `sender`, a `msg_type` of `"5"` or `5.0`,
which pydantic's lax mode coerces, any value out of range) makes it answer None, and
the caller validates the body through `PushIn` as before, which gives the answer or the
422 naming the field. So the two paths cannot disagree on an error: only PushIn makes
errors.
"""

from __future__ import annotations

import re
from typing import Any

from push_service.schemas import MAX_RECIPIENTS, PushIn
from shared.uids import valid_uid

__all__ = ["may_hold_surrogates", "quick_push"]

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def may_hold_surrogates(body: bytes) -> bool:
    """Whether a JSON body escapes a UTF-16 surrogate (maybe a lone one, which only
    PushIn may judge); a pair (an escaped emoji) says yes too."""
    return _SURROGATE_ESCAPE.search(body) is not None


_KEYS = frozenset(
    {"to", "content", "msg_type", "from", "priority", "ttl_s", "store", "wait_ack_ms"}
)
_PRIORITIES = frozenset({"normal", "high"})
_MAX_TTL_S = 30 * 24 * 3600
_MAX_MSG_TYPE = 2**31 - 1
_MAX_WAIT_ACK_MS = 10_000


def _int_in(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def _unicode(text: str) -> bool:
    """No lone surrogate (pydantic refuses a str holding one)."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _uids(to: Any) -> bool:
    if type(to) is not list or not 1 <= len(to) <= MAX_RECIPIENTS:
        return False
    for uid in to:
        if type(uid) is not str or not valid_uid(uid):
            return False
    return len(to) == 1 or len(set(to)) == len(to)


def quick_push(data: Any) -> PushIn | None:
    """`data` (a decoded JSON body) as a PushIn, if it has the canonical shape and every
    value is valid; None if PushIn itself must judge it. `content` is not looked into:
    a caller whose decoder lets lone surrogates through (json.loads) checks the raw
    body for them first (`may_hold_surrogates`); orjson refuses them itself."""
    if type(data) is not dict or "content" not in data or not _KEYS.issuperset(data):
        return None
    to = data.get("to")
    if not _uids(to):
        return None
    msg_type = data.get("msg_type", 0)
    sender = data.get("from", "admin")
    priority = data.get("priority", "normal")
    ttl_s = data.get("ttl_s")
    store = data.get("store", True)
    wait_ack_ms = data.get("wait_ack_ms")
    if not (
        _int_in(msg_type, 0, _MAX_MSG_TYPE)
        and type(sender) is str
        and 1 <= len(sender) <= 128
        and _unicode(sender)
        and type(priority) is str
        and priority in _PRIORITIES
        and (ttl_s is None or _int_in(ttl_s, 1, _MAX_TTL_S))
        and type(store) is bool
        and (wait_ack_ms is None or _int_in(wait_ack_ms, 0, _MAX_WAIT_ACK_MS))
    ):
        return None
    # Every field checked above as PushIn's validators would: built without them.
    return PushIn.model_construct(
        to=to,
        content=data["content"],
        msg_type=msg_type,
        sender=sender,
        priority=priority,
        ttl_s=ttl_s,
        store=store,
        wait_ack_ms=wait_ack_ms,
    )
