"""Message content: validated and encoded to JSON once, at the edge."""

from __future__ import annotations

import json
from typing import Any, Protocol

import orjson

from push_service.schemas import MAX_CONTENT_BYTES
from shared.errors import InvalidInput, PayloadTooLarge
from shared.ids import derived_id, new_id
from shared.models import Message

__all__ = ["MAX_CONTENT_DEPTH", "encode_content", "new_message"]

# Arrays and objects inside one another, at most: orjson's bound when it encodes (past
# it, one request's content would cost a recursion as deep as the client likes).
MAX_CONTENT_DEPTH = 254


class _MessageFields(Protocol):
    content: Any
    msg_type: int
    sender: str


def new_message(
    body: _MessageFields, now_ms: int, seed: str | None = None, n: int = 0, tag: str = ""
) -> Message:
    """A push's message with fresh ids; sent under an Idempotency-Key (`seed`, the `n`th
    message of its request), its msg_id is derived from it: a retry after a 5xx (which is
    not kept: the push may have gone out in part) carries the same msg_id, which clients
    drop as a duplicate. Each attempt keeps a push_id (and receipt) of its own, slot-tagged
    with `tag` when one is given (`shared.keys.slot_tagged`). The content is encoded once."""
    return Message(
        msg_id=new_id() if seed is None else derived_id(seed, "msg", n),
        push_id=f"{new_id()}.{tag}" if tag else new_id(),
        msg_type=body.msg_type,
        sender=body.sender,
        content_json=encode_content(body.content),
        ts_ms=now_ms,
    )


def encode_content(content: Any) -> bytes:
    """The content as compact UTF-8 JSON, at most MAX_CONTENT_BYTES.

    orjson first (about 25 times faster). It writes NaN and Infinity as null, so content
    whose encoding holds a null is encoded again by json, which refuses them; so is
    content orjson refuses (an integer past 64 bits, a lone surrogate), but for content
    nested deeper than MAX_CONTENT_DEPTH, which is refused."""
    try:
        encoded = orjson.dumps(content)
    except TypeError as exc:  # orjson.JSONEncodeError
        if "Recursion limit" in str(exc):
            raise _too_deep() from None
        encoded = b"null"
    if b"null" in encoded:
        encoded = _encoded_by_json(content)
    if len(encoded) > MAX_CONTENT_BYTES:
        raise PayloadTooLarge(
            "content", f"{len(encoded)} bytes once encoded; the limit is {MAX_CONTENT_BYTES}"
        )
    return encoded


def _too_deep() -> InvalidInput:
    return InvalidInput(
        "content", f"nested too deeply: at most {MAX_CONTENT_DEPTH} levels of arrays and objects"
    )


def _encoded_by_json(content: Any) -> bytes:
    try:
        data = json.dumps(content, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise InvalidInput(
            "content",
            "must be JSON: NaN, Infinity and numbers past a double's range (1e999) are not",
        ) from None
    except RecursionError:
        raise _too_deep() from None
    try:
        return data.encode()
    except UnicodeEncodeError:
        # JSON allows "\ud83d" (half an emoji, as JS clients cut strings); UTF-8 does not.
        raise InvalidInput(
            "content", "holds a lone UTF-16 surrogate (half of a character): not valid Unicode"
        ) from None
