"""uvicorn, with the bounds it lacks on a request head's size (shared.http_heads).

Under httptools (uvicorn's parser where it is installed, as here) a head had no bound at
all: the parser joins the pieces of a header value split over many reads with `+=`
(quadratic), and uvicorn keeps every header; eight sockets sending headers without end
grew a worker by 1.8 GB. h11 stops at 16 KiB, but with a 400 and no count of fields.

`HeadBudget` counts the bytes of the pending head as they arrive, before the parser
sees them: a read that would take the head past IMROUTE_HTTP_MAX_HEAD_BYTES is given to
the parser only up to the limit, and if the head is still not whole the connection gets
a JSON 431 and is closed. A body's bytes count against the next head's room too, and a
read larger than the room in a body goes to the parser in slices (of the room, then of
the limit), its state looked at after each: a head begun within a slice (after a body,
or pipelined) has at most that slice parsed uncounted. As a backstop, each protocol
counts the size of the head it parsed (target, names, values) and refuses it past the
limit, so no head over it reaches the app (under h11, bytes behind an answer wait in
h11's buffer, one read at most, and are checked when parsed).
The count of fields and the request target's length are checked by each parser's
protocol as it parses (`http_server`): past the limit, the callback records its
refusal and raises, which uvicorn answers through `send_400_response`, here the
refusal's own JSON answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, ClassVar, NoReturn

import h11

from shared.http_answers import json_refusal_answer
from shared.http_heads import HeadLimits, HeadRefusal, check_request
from shared.throttled import Throttled, ThrottledLine

__all__ = [
    "LOG_EVERY_S",
    "HeadBudget",
    "HeadCuts",
    "HeadRefusals",
    "LimitedH11Connection",
    "ParseErrorLines",
]

log = logging.getLogger(__name__)


LOG_EVERY_S = 10.0


class HeadCuts:
    """Connections the head deadline closed, counted; logged at once, then at most every
    LOG_EVERY_S with the counts since (`ThrottledLine`: a slowloris attack is thousands
    of sockets, and must not become thousands of log lines)."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        # closed with part of a head (answered 408)
        self.partial = ThrottledLine(
            log,
            "closed %(n)d connection(s) with a request head not whole after %(timeout)gs "
            "(408; IMROUTE_HTTP_HEADER_TIMEOUT_S)",
            every_s=LOG_EVERY_S,
            now=clock,
        )
        # closed having sent nothing
        self.silent = ThrottledLine(
            log,
            "closed %(n)d connection(s) that sent nothing in %(timeout)gs "
            "(IMROUTE_HTTP_HEADER_TIMEOUT_S)",
            every_s=LOG_EVERY_S,
            now=clock,
        )

    def cut(self, began: bool) -> None:
        (self.partial if began else self.silent).note(timeout=self.timeout_s)


class HeadRefusals:
    """Heads refused for a limit, counted by kind (the refusal's `error`), each kind
    logged at once and then at most every `every_s` with the count since
    (`ThrottledLine`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, every_s: float = 10.0) -> None:
        self._clock = clock
        self._every_s = every_s
        self._kinds: dict[str, ThrottledLine] = {}

    @property
    def counts(self) -> dict[str, int]:
        return {kind: line.total for kind, line in self._kinds.items()}

    def refused(self, refusal: HeadRefusal) -> None:
        line = self._kinds.get(refusal.error)
        if line is None:
            line = self._kinds[refusal.error] = ThrottledLine(
                log,
                "refused %(n)d request head(s) (%(status)d): %(detail)s",
                every_s=self._every_s,
                now=self._clock,
            )
        line.note(status=refusal.status, detail=refusal.detail)


# What an upgrade request to the push service is logged as.
UPGRADE_LINE = (
    "Upgrade request answered as plain HTTP: the push service serves no WebSocket "
    "(clients connect to the gateways that /v1/dispatch names)."
)


class ParseErrorLines(logging.Filter):
    """uvicorn's warnings that any client causes at will, a line per request, on the
    `uvicorn.error` logger: each logged at once, then at most once per `every_s` with
    the count since, like every refusal. They are its line for a request it cannot
    parse (a head stopped by a limit is one: the limit stops the parser), and its two
    for an upgrade request (the push service serves no WebSocket: `ws="none"`), said as
    one line that says so; uvicorn's second advised installing a WebSocket library."""

    MESSAGE = "Invalid HTTP request received."
    UPGRADE = "Unsupported upgrade request."
    NO_WS_LIBRARY = "No supported WebSocket library detected."  # the start of its line
    THROTTLED = (MESSAGE, UPGRADE, NO_WS_LIBRARY)

    def __init__(self, clock: Callable[[], float] = time.monotonic, every_s: float = 10.0) -> None:
        super().__init__()
        self._clock = clock
        self._lines = {message: Throttled(every_s) for message in self.THROTTLED}

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg
        if not isinstance(message, str) or not message.startswith(self.THROTTLED):
            return True
        key = next(m for m in self.THROTTLED if message.startswith(m))
        if key == self.NO_WS_LIBRARY:
            return False
        if key == self.UPGRADE:
            message = UPGRADE_LINE
        since = self._lines[key].note(self._clock())
        if not since:
            return False
        record.msg = (
            f"{message[:-1]}: {since} requests since the last line" if since > 1 else message
        )
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
        """A read within the room goes to the parser whole (counted in a body too,
        cheaper than asking: the end of each request gives the next head its whole room
        again). A larger one goes in slices of at most the room (or, in a body that
        spent it, the whole limit), the state looked at again after each: a head begun
        within a slice has at most that slice parsed before it is counted, and is then
        held to what is left of its own room."""
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
        self.transport.write(json_refusal_answer(400, "bad_request", msg))
        self.transport.close()

    def _answer(self, refusal: HeadRefusal) -> None:
        self.head_refusals.refused(refusal)
        self.transport.write(json_refusal_answer(refusal.status, refusal.error, refusal.detail))
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
