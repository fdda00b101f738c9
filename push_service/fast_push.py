"""POST /v1/push without FastAPI's per-request machinery, for the bodies it can vouch for.

The P2P push is the endpoint callers hit most, and FastAPI's request cycle (dependency
resolution, pydantic validation of the body and of `content` as a JsonValue, the
response class) cost about a third of its CPU. This pure-ASGI shell sits inside the
gates (`push_service.admission`: load, key, rate, body size), in front of the app: it
reads the body, decodes it with orjson, checks it by hand (`quick_push`, below) and
calls the same service method the route calls, answering with the same JSON.

Anything else goes to the FastAPI route unchanged, with the body it already read: a
body orjson cannot decode as json.loads would (NaN, a lone surrogate, a BOM, an integer
past 64 bits, which orjson makes a float), one whose shape or values quick_push does not
vouch for (the route's pydantic model then gives its answer or its 422 naming the
field), an Idempotency-Key (the route's `Once` keeps the answer), a content-type the
route would not read as JSON, and every other path. The route stays what the OpenAPI
schema documents.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, get_args

import orjson
from annotated_types import Ge, Le, MaxLen, MinLen
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from push_service.errors import handler_for
from push_service.schemas import PushIn
from push_service.services import Pushed, Services
from shared.uids import valid_uid

__all__ = [
    "PATH",
    "FastPush",
    "ServicesSlot",
    "may_hold_surrogates",
    "push_answer",
    "quick_push",
]

PATH = "/v1/push"
_JSON_TYPES = frozenset({b"application/json", b"application/json; charset=utf-8"})
# orjson reads an integer past 64 bits as a float; json.loads and pydantic keep it whole.
# A run of 19 digits (maybe in a string: then the route costs a little more) goes there.
_LONG_NUMBER = re.compile(rb"[0-9]{19}")
_HEADERS = [(b"content-type", b"application/json")]


class ServicesSlot:
    """Where the app's lifespan puts its services once they are open."""

    services: Services | None = None


def push_answer(pushed: Pushed) -> dict[str, Any]:
    """POST /v1/push's answer (PushOut, built directly: validating our own output again
    is pure cost on the hottest endpoint)."""
    message, outcome = pushed.message, pushed.outcome
    answer: dict[str, Any] = {
        "push_id": message.push_id,
        "msg_id": message.msg_id,
        "delivered": outcome.delivered,
        "offline": outcome.offline,
        "failed": outcome.failed,
        "queued": outcome.queued,
        "errors": [{"gateway_id": e.gateway_id, "error": e.error} for e in outcome.errors],
    }
    if pushed.acked is not None:
        answer["acked"] = pushed.acked
        answer["unacked"] = pushed.unacked
    return answer


Handlers = Mapping[Any, Callable[..., Any]]


class FastPush:
    def __init__(self, app: ASGIApp, slot: ServicesSlot, handlers: Handlers) -> None:
        self.app = app
        self.slot = slot
        self.handlers = handlers  # the app's exception handlers: errors look the same
        self.taken = 0  # pushes answered here (the rest went to the route)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        services = self.slot.services
        if (
            services is None
            or scope["type"] != "http"
            or scope["path"] != PATH
            or scope["method"] != "POST"
            or scope.get("root_path")
            or not self._plain(scope["headers"])
        ):
            await self.app(scope, receive, send)
            return
        body, more = await _read_body(receive)
        if more is not None:  # the client went away, or the body limit answered
            await self.app(scope, _replay(body, receive, more), send)
            return
        data = _decode(body)
        push_in = quick_push(data) if data is not None else None
        if push_in is None:
            await self.app(scope, _replay(body, receive), send)
            return
        self.taken += 1
        try:
            pushed = await services.pushes.push_one(push_in, seed=None)  # no Idempotency-Key
        except Exception as exc:
            handler = handler_for(self.handlers, exc)
            if handler is None:
                raise  # a 500, from the app's outermost middleware, as on the route
            response = await handler(Request(scope), exc)
            await response(scope, receive, send)
            return
        await _answer(send, orjson.dumps(push_answer(pushed)))

    def _plain(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """A JSON body and no Idempotency-Key. (The key was checked by
        push_service.admission.Admission, always in front of this, for the push scope
        POST /v1/push needs.)"""
        content_type = None
        for name, value in headers:
            if name == b"content-type":
                content_type = value.lower()
            elif name == b"idempotency-key":
                return False
        return content_type in _JSON_TYPES


def _decode(body: bytes) -> Any:
    """The body decoded, where orjson decodes it as json.loads would; else None."""
    if _LONG_NUMBER.search(body) is not None:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


async def _read_body(receive: Receive) -> tuple[bytes, Message | None]:
    """The whole body, and None; or what was read so far and the message that ended it
    early (a disconnect)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), message
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks), None


def _replay(body: bytes, receive: Receive, ending: Message | None = None) -> Receive:
    """A receive that hands the app the body already read, then the rest as it comes."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            if ending is None:
                return {"type": "http.request", "body": body, "more_body": False}
            return ending
        return await receive()

    return again


async def _answer(send: Send, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [*_HEADERS, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


# ---------------------------------------------------------------------- the hand check
#
# `PushIn` (pydantic) is the contract; `quick_push` is a shortcut that accepts a strict
# subset of what it accepts, with the same resulting values, in about a tenth of the
# time. Whatever it does not recognise at once (a key spelt `sender`, a `msg_type` of
# "5" or 5.0, which pydantic's lax mode coerces, any value out of range) makes it answer
# None, and the caller validates the body through `PushIn`, which gives the answer or
# the 422 naming the field. So the two cannot disagree on an error: only PushIn makes
# errors. Its keys, bounds, choices and defaults are read from PushIn's fields.

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_FIELDS = PushIn.model_fields
_KEYS = frozenset(f.alias or name for name, f in _FIELDS.items())
_PRIORITIES = frozenset(get_args(_FIELDS["priority"].annotation))
_MSG_TYPE = _FIELDS["msg_type"].default
_SENDER = _FIELDS["sender"].default
_PRIORITY = _FIELDS["priority"].default
_STORE = _FIELDS["store"].default


def _bounds(name: str) -> tuple[int, int]:
    """PushIn's bounds on a field: its value (ge, le), or its length (min, max)."""
    low = high = None
    for rule in _FIELDS[name].metadata:
        if isinstance(rule, Ge | MinLen):
            low = rule.ge if isinstance(rule, Ge) else rule.min_length
        elif isinstance(rule, Le | MaxLen):
            high = rule.le if isinstance(rule, Le) else rule.max_length
    if type(low) is not int or type(high) is not int:
        raise TypeError(f"PushIn.{name}: no integer bounds to check by hand")
    return low, high


_TO_MIN, _TO_MAX = _bounds("to")
_MSG_TYPE_MIN, _MSG_TYPE_MAX = _bounds("msg_type")
_SENDER_MIN, _SENDER_MAX = _bounds("sender")
_TTL_S_MIN, _TTL_S_MAX = _bounds("ttl_s")
_WAIT_ACK_MS_MIN, _WAIT_ACK_MS_MAX = _bounds("wait_ack_ms")


def may_hold_surrogates(body: bytes) -> bool:
    """Whether a JSON body escapes a UTF-16 surrogate (maybe a lone one, which only
    PushIn may judge); a pair (an escaped emoji) says yes too."""
    return _SURROGATE_ESCAPE.search(body) is not None


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
    if type(to) is not list or not _TO_MIN <= len(to) <= _TO_MAX:
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
    msg_type = data.get("msg_type", _MSG_TYPE)
    sender = data.get("from", _SENDER)
    priority = data.get("priority", _PRIORITY)
    ttl_s = data.get("ttl_s")
    store = data.get("store", _STORE)
    wait_ack_ms = data.get("wait_ack_ms")
    if not (
        _int_in(msg_type, _MSG_TYPE_MIN, _MSG_TYPE_MAX)
        and type(sender) is str
        and _SENDER_MIN <= len(sender) <= _SENDER_MAX
        and _unicode(sender)
        and type(priority) is str
        and priority in _PRIORITIES
        and (ttl_s is None or _int_in(ttl_s, _TTL_S_MIN, _TTL_S_MAX))
        and type(store) is bool
        and (wait_ack_ms is None or _int_in(wait_ack_ms, _WAIT_ACK_MS_MIN, _WAIT_ACK_MS_MAX))
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
