"""uvicorn, with the bounds it lacks on a request head's size (shared.http_heads).

Under httptools (uvicorn's parser where it is installed, as here) a head had no bound at
all: the parser joins the pieces of a header value split over many reads with `+=`
(quadratic), and uvicorn keeps every header; eight sockets sending headers without end
grew a worker by 1.8 GB. h11 stops at 16 KiB, but with a 400 and no count of fields.

`HeadBudget` counts the bytes of the pending head as they arrive, before the parser
sees them: a read that would take the head past IMROUTE_HTTP_MAX_HEAD_BYTES is given to
the parser only up to the limit, and if the head is still not whole the connection gets
a JSON 431 and is closed. So a head costs at most that many bytes, whatever its reads.
The count of fields and the request target's length are checked by each parser's
protocol as it parses (`http_server`): past the limit, the callback records its
refusal and raises, which uvicorn answers through `send_400_response`, here the
refusal's own JSON answer. Bodies are not counted (they have their own limits).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, ClassVar, NoReturn

import h11

from shared.http_heads import HeadLimits, HeadRefusal, check_request
from shared.throttled import Throttled

__all__ = [
    "HeadBudget",
    "HeadRefusals",
    "LimitedH11Connection",
    "ParseErrorLines",
    "closing_response",
]

log = logging.getLogger(__name__)


def closing_response(status: int, error: str, detail: str) -> bytes:
    """A whole JSON response after which the connection is closed."""
    body = json.dumps({"error": error, "detail": detail}).encode()
    return (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nx-content-type-options: nosniff\r\n"
        "connection: close\r\n\r\n".encode()
        + body
    )


class HeadRefusals:
    """Heads refused for a limit, counted by kind (the refusal's `error`), each kind
    logged at once and then at most every `every_s` with the count since."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, every_s: float = 10.0) -> None:
        self.counts: Counter[str] = Counter()
        self._clock = clock
        self._every_s = every_s
        self._lines: dict[str, Throttled] = {}

    def refused(self, refusal: HeadRefusal) -> None:
        self.counts[refusal.error] += 1
        line = self._lines.get(refusal.error)
        if line is None:
            line = self._lines[refusal.error] = Throttled(self._every_s)
        since = line.note(self._clock())
        if since:
            log.warning(
                "refused %d request head(s) (%d): %s", since, refusal.status, refusal.detail
            )


class ParseErrorLines(logging.Filter):
    """uvicorn's warning for each request it cannot parse (a head stopped by a limit is
    one: the limit stops the parser), on the `uvicorn.error` logger: logged at once,
    then at most once per `every_s` with the count since, like every refusal."""

    MESSAGE = "Invalid HTTP request received."

    def __init__(self, clock: Callable[[], float] = time.monotonic, every_s: float = 10.0) -> None:
        super().__init__()
        self._clock = clock
        self._line = Throttled(every_s)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != self.MESSAGE:
            return True
        since = self._line.note(self._clock())
        if not since:
            return False
        if since > 1:
            record.msg = f"{self.MESSAGE[:-1]}: {since} requests since the last line"
        return True


class HeadBudget(asyncio.Protocol):
    """The byte count of the pending head, for both parsers' protocols (it comes before
    uvicorn's protocol in their bases, so `super()` here is uvicorn's)."""

    head_limits: ClassVar[HeadLimits] = HeadLimits()
    _max_headers: ClassVar[int] = HeadLimits().max_headers  # head_limits', read per field
    _max_bytes: ClassVar[int] = HeadLimits().max_bytes  # likewise
    head_refusals: ClassVar[HeadRefusals]
    # What the pending head may still take; the class's value is the whole limit.
    _head_room: int = HeadLimits().max_bytes
    _refusal: HeadRefusal | None = None  # a parser callback's, answered by send_400_response

    transport: asyncio.Transport

    def _in_head(self) -> bool:
        """Whether the bytes that come next belong to a request head."""
        raise NotImplementedError

    def _heads_parsed(self) -> int:
        """How many request heads the parser has parsed on this connection."""
        raise NotImplementedError

    def _head_done(self) -> None:
        """A head was parsed: the next one may take the whole limit."""
        self._head_room = self.head_limits.max_bytes

    def _refuse_head(self, refusal: HeadRefusal) -> NoReturn:
        """Raised from a parser callback: uvicorn answers with send_400_response."""
        self._refusal = refusal
        raise ValueError(refusal.detail)

    def _sync_room(self) -> None:
        """The parser was given bytes: a parser that can tell how many of them wait for
        the next head sets the room from that (h11); httptools' callbacks set it."""

    def data_received(self, data: bytes) -> None:
        room = self._head_room
        if len(data) <= room:
            # Counted in the body too (cheaper than asking): the end of each request
            # gives the next head its whole room again.
            self._head_room = room - len(data)
            super().data_received(data)
            self._sync_room()
            return
        self._sliced(data)

    def _sliced(self, data: bytes) -> None:
        """A read larger than the room, given to the parser in slices of at most the room
        (or, in a body that spent it, the whole limit), the state looked at again after
        each: a head begun within a slice has at most that slice parsed before it is
        counted, and is then held to what is left of its own room."""
        while data:
            room = self._head_room
            if len(data) <= room:
                self._head_room = room - len(data)
                super().data_received(data)
                self._sync_room()
                return
            in_head = self._in_head()
            size = room if in_head or room else self.head_limits.max_bytes
            heads = self._heads_parsed()
            self._head_room = 0  # the parser's callbacks give a parsed head its room again
            if size:  # (never an empty read: to h11 that says the client closed)
                super().data_received(data[:size])
                self._sync_room()
                if self.transport.is_closing():
                    return
            if in_head and self._heads_parsed() == heads:
                self._answer(self.head_limits.too_large())
                return
            data = data[size:]

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to a request it cannot parse is a text/plain 400: ours is
        # JSON, like every other refusal, or the limit's own answer when a limit
        # stopped the parser.
        refusal = self._refusal
        if refusal is not None:
            self._answer(refusal)
            return
        self.transport.write(closing_response(400, "bad_request", msg))
        self.transport.close()

    def _answer(self, refusal: HeadRefusal) -> None:
        self.head_refusals.refused(refusal)
        self.transport.write(closing_response(refusal.status, refusal.error, refusal.detail))
        self.transport.close()


def parsed_size(request: h11.Request) -> int:
    """The bytes of a parsed request's target, header names and values."""
    return len(request.target) + sum(len(n) + len(v) for n, v in request.headers.raw_items())


class LimitedH11Connection(h11.Connection):
    """h11's connection, refusing a request over the count of fields or the target's
    length, and saying which limit its own "Receive buffer too long" was."""

    def __init__(self, limits: HeadLimits) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=limits.max_bytes)
        self.limits = limits
        self.refusal: HeadRefusal | None = None
        self.requests = 0  # request heads parsed

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            if exc.error_status_hint == 431:  # a head past max_incomplete_event_size
                self.refusal = self.limits.too_large()
            raise
        if type(event) is h11.Request:
            self.requests += 1
            refusal = check_request(len(event.target), len(event.headers), self.limits)
            # The backstop of the byte count: what h11 kept of this head (a pipelined
            # head waits whole in h11's buffer, where its limit does not look).
            if refusal is None and parsed_size(event) > self.limits.max_bytes:
                refusal = self.limits.too_large()
            if refusal is not None:
                self.refusal = refusal
                raise h11.RemoteProtocolError(refusal.detail, refusal.status)
        return event
