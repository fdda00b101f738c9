"""uvicorn, with the limit it lacks: a deadline for each request head.

uvicorn's only timer on a connection is its keep-alive one, armed when a response ends
and cancelled by the next byte that arrives. A connection that never finishes its
request line and headers (slowloris: a byte every few seconds, or nothing at all after
connecting) is therefore held for ever. Its HTTP protocols are subclassed here to arm a
deadline when a connection opens and when the next request's first byte arrives, and to
drop it once the head is parsed. A head not whole by then gets a 408 (JSON, like every
other refusal) and the connection is closed; a connection that sent nothing is closed
without a word, as browsers' speculative pre-connects expect. A request uvicorn cannot
parse gets a JSON 400 too (uvicorn's own is text/plain).

`limit_concurrency` (503 from uvicorn, past that many open connections or running
requests) and the keep-alive timeout are uvicorn's own; `run` sets all three from
Settings. uvicorn's 503 is text/plain: under httptools (uvicorn's choice where it is
installed, as here) it is answered in JSON too. The push service serves no WebSocket,
so an upgrade request is plain HTTP to it (uvicorn's WebSocket layer answered text).

A head's size is bounded too, in bytes, header fields and target length
(`head_limits`): 431 or 414 in JSON, the connection closed. Both kinds of cut are
counted for /metrics (`HeadCounts`). Every response says `X-Content-Type-Options:
nosniff` (uvicorn's default headers: no cost per request).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import math
import socket
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar, Literal

import h11
import uvicorn
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from push_service.errors import send_error
from push_service.head_limits import (
    LOG_EVERY_S,
    HeadBudget,
    HeadCuts,
    HeadRefusals,
    LimitedH11Connection,
    ParseErrorLines,
)
from push_service.idempotency.http import WAIT_MARGIN_S
from push_service.schemas import MAX_WAIT_ACK_MS
from shared.http_answers import json_refusal_answer
from shared.http_heads import HeadLimits
from shared.logs import dict_config
from shared.settings import PushSettings

__all__ = [
    "LOG_EVERY_S",
    "RESPONSE_HEADERS",
    "HeadCounts",
    "HeadCuts",
    "head_deadline_protocol",
    "requests_grace_s",
    "run",
]

log = logging.getLogger(__name__)

Parser = Literal["auto", "httptools", "h11"]


# How long a connection answered 408 is read (and its bytes dropped) before it is closed.
LINGER_S = 2.0

# On every response of the server: a browser never takes one for another type than it
# says (a JSON error for a script, or HTML).
RESPONSE_HEADERS = [("X-Content-Type-Options", "nosniff")]


async def _concurrency_exceeded(scope: Any, receive: Any, send: Any) -> None:
    """uvicorn's 503 past IMROUTE_HTTP_MAX_CONCURRENCY, as JSON."""
    await send_error(
        send,
        503,
        "overloaded",
        "the push service holds IMROUTE_HTTP_MAX_CONCURRENCY connections or requests; retry later",
        [(b"retry-after", b"1"), (b"connection", b"close")],
    )


def _timeout_response(timeout_s: float) -> bytes:
    return json_refusal_answer(
        408,
        "request_timeout",
        f"the request line and headers did not arrive within {timeout_s:g} s "
        "(IMROUTE_HTTP_HEADER_TIMEOUT_S)",
    )


class HeadCounts:
    """The heads cut by the deadline and refused for a limit: one process's counts, a
    collector of the app's metrics (`create_app`) and counted by its server (`run`)."""

    def __init__(self, cuts: HeadCuts, refusals: HeadRefusals | None = None) -> None:
        self.cuts = cuts
        self.refusals = refusals or HeadRefusals()

    def collect(self) -> Iterator[Metric]:
        timeouts = CounterMetricFamily(
            "imroute_http_head_timeouts",
            "Connections closed by IMROUTE_HTTP_HEADER_TIMEOUT_S: with part of a request "
            "head (answered 408), or having sent nothing",
            labels=["sent"],
        )
        timeouts.add_metric(["part"], self.cuts.partial.total)
        timeouts.add_metric(["nothing"], self.cuts.silent.total)
        yield timeouts
        refused = CounterMetricFamily(
            "imroute_http_heads_refused",
            "Request heads refused for a limit, by reason: headers_too_large and "
            "too_many_headers (431), uri_too_long (414)",
            labels=["reason"],
        )
        for reason in ("headers_too_large", "too_many_headers", "uri_too_long"):
            refused.add_metric([reason], self.refusals.counts.get(reason, 0))
        yield refused


class _Corked:
    """A connection's writes of one loop turn, sent as one: uvicorn writes an answer's
    head and its body apart, which cost two system calls and two TCP segments (one
    system call per push at saturation, where everything else is shared). What is held
    goes out at the end of the turn, or before a close; an abort drops it."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(data)

    def writelines(self, lines: Iterable[bytes]) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        """Send what is held now (also done at the end of the turn, and by `close`)."""
        held, self._held = self._held, []
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = []
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(d) for d in self._held)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _HeadDeadline(HeadBudget):
    """The deadline's state and its expiry, shared by both parsers' protocols (it comes
    first in their bases, then the byte count, so `super()` is then uvicorn's protocol)."""

    head_timeout_s: ClassVar[float] = 10.0
    head_cuts: ClassVar[HeadCuts]
    _timeout_response: ClassVar[bytes] = b""

    loop: asyncio.AbstractEventLoop
    cycle: Any  # uvicorn's request cycle in progress (None between requests)
    _head_timer: asyncio.TimerHandle | None = None
    _head_begun = False  # a byte of the pending head has arrived
    _lingering = False  # answered and half-closed: what comes is dropped until the close

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_Corked(transport, self.loop))  # type: ignore[arg-type]
        self._arm_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        super().data_received(data)

    def eof_received(self) -> bool | None:
        """The client sent all it will (a half-close). uvicorn closes the connection at
        once, so a request it had whole but not yet answered lost its answer though it
        took effect (a push sent, its caller none the wiser). Such a request is answered
        first, and the connection closed after it, as on a graceful shutdown. Anything
        else closes it as before: no request, or one whose body stops short (its app
        reads a disconnect), or more pipelined behind it."""
        if self._lingering:
            return None  # the loop closes the transport: the client read the answer
        corked = self.transport
        if isinstance(corked, _Corked):
            corked.flush()  # an answer written in this turn goes out before any close
        cycle = self.cycle
        if (
            cycle is None
            or cycle.response_complete
            or cycle.more_body
            or getattr(self, "pipeline", None)
        ):
            super().eof_received()
            return None  # the loop closes the transport
        cycle.keep_alive = False  # closed once this one is answered
        return True

    def _arm_head(self) -> None:
        if self._head_timer is None and not self._lingering:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_expired)

    def _disarm_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._head_begun = False

    def _answering(self) -> bool:
        """Whether a request before the pending head is still being answered."""
        raise NotImplementedError

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._answering():
            # A pipelined head behind a slow answer: its time starts again after it.
            self._arm_head()
            return
        self.head_cuts.cut(self._head_begun)
        if not self._head_begun:
            self.transport.close()  # it sent nothing: nothing to answer, nor to read
            return
        self.transport.write(self._timeout_response)
        self._linger()

    def _linger(self) -> None:
        """Close after an answer the client may still be sending into (a head still
        coming): the answer, then our side shut (FIN), what the client sends read and
        dropped until it closes or LINGER_S pass, then the close. Closed at once, its
        next bytes would meet a reset, which can take the answer with it before the
        client reads it (RFC 9112 9.6; nginx's lingering_close)."""
        transport = self.transport
        if not transport.can_write_eof():
            transport.close()
            return
        self._lingering = True
        transport.write_eof()
        self.loop.call_later(LINGER_S, transport.close)


def _httptools_class() -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.flow_control import service_unavailable
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    uvicorn_on_header = HttpToolsProtocol.on_header

    # uvicorn types its eof_received as returning None; asyncio's may return True.
    class HttpToolsHeadDeadline(_HeadDeadline, HttpToolsProtocol):  # type: ignore[misc]
        """httptools calls back at a head's first byte, with the target, with each
        field and at its end; and at the end of the request."""

        _head_open = True  # the bytes that come next are a head's (not a body's)
        _heads = 0  # request heads parsed
        _parsed = 0  # bytes of the pending head's target, names and values, as parsed

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_begun = True
            self._parsed = 0
            self._arm_head()

        def on_url(self, url: bytes) -> None:
            super().on_url(url)
            if len(self.url) > self.head_limits.max_url_bytes:
                self._refuse_head(self.head_limits.url_too_long())
            self._parsed += len(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            # uvicorn's, called directly: this runs for every field of every request.
            uvicorn_on_header(self, name, value)
            if len(self.headers) > self._max_headers:
                self._refuse_head(self.head_limits.too_many_headers())
            # The backstop of the byte count: what the parser kept of this head.
            self._parsed += len(name) + len(value)
            if self._parsed > self._max_bytes:
                self._refuse_head(self.head_limits.too_large())

        def on_headers_complete(self) -> None:
            self._disarm_head()
            self._heads += 1
            self._head_open = False
            self._head_done()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._head_open = True
            self._head_done()
            super().on_message_complete()

        def _in_head(self) -> bool:
            return self._head_open

        def _heads_parsed(self) -> int:
            return self._heads

        def _answering(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            if app is service_unavailable:  # uvicorn's limit_concurrency, text/plain
                app = _concurrency_exceeded
            super()._start_asgi_task(cycle, app)

    return HttpToolsHeadDeadline


class H11HeadDeadline(_HeadDeadline, H11Protocol):  # type: ignore[misc]  # eof_received
    """h11 has no per-head callbacks: its state says whether a head is pending (IDLE).
    Its connection refuses the fields and targets over the limits."""

    conn: LimitedH11Connection

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = LimitedH11Connection(self.head_limits)

    def data_received(self, data: bytes) -> None:
        if data and self.conn.their_state is h11.IDLE:
            self._head_begun = True
            self._arm_head()
        self._sync_room()  # (h11 may have parsed its buffer since: a cycle ended)
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the head was parsed
            self._disarm_head()

    def _sync_room(self) -> None:
        # What waits in h11's buffer is the pending head's (IDLE: its part so far; DONE:
        # a pipelined one, behind the answer); in a body, the next slice may be a limit.
        state = self.conn.their_state
        if state is h11.IDLE or state is h11.DONE:
            self._head_room = max(0, self.head_limits.max_bytes - len(self.conn.trailing_data[0]))
        else:
            self._head_room = self.head_limits.max_bytes

    def _in_head(self) -> bool:
        return self.conn.their_state is h11.IDLE

    def _heads_parsed(self) -> int:
        return self.conn.requests

    def send_400_response(self, msg: str) -> None:
        if self.conn.refusal is not None:
            self._refusal = self.conn.refusal
        super().send_400_response(msg)

    def _answering(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete


def head_deadline_protocol(
    timeout_s: float,
    parser: Parser = "auto",
    limits: HeadLimits | None = None,
    counts: HeadCounts | None = None,
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools when installed, as uvicorn's "auto" picks, else
    h11) with a deadline of `timeout_s` for each request head, and `limits` on its size;
    what they cut is counted in `counts`."""
    if parser == "auto":
        parser = "httptools" if importlib.util.find_spec("httptools") else "h11"
    base = _httptools_class() if parser == "httptools" else H11HeadDeadline
    limits = limits or HeadLimits()
    counts = counts or HeadCounts(HeadCuts(timeout_s))
    attrs: dict[str, Any] = {
        "head_timeout_s": timeout_s,
        "head_cuts": counts.cuts,
        "head_limits": limits,
        "_max_headers": limits.max_headers,
        "_max_bytes": limits.max_bytes,
        "head_refusals": counts.refusals,
        "_head_room": limits.max_bytes,
        "_timeout_response": _timeout_response(timeout_s),
    }
    return type(base.__name__, (base,), attrs)


def requests_grace_s(settings: PushSettings) -> float:
    """How long a stopping push service lets its open requests finish before it cuts
    them: the longest one waits (a duplicate of a push waiting for its acks: the deliver
    timeout, the Idempotency-Key margin and `wait_ack_ms`'s bound), and a second, rounded
    up to a whole second as uvicorn takes it. Without a bound, a client that never
    finished its request held a stopping worker for ever."""
    return float(math.ceil(settings.deliver_timeout_s + WAIT_MARGIN_S + MAX_WAIT_ACK_MS / 1000 + 1))


def run(
    app: ASGIApp,
    settings: PushSettings,
    sock: socket.socket | None = None,
    counts: HeadCounts | None = None,
) -> None:
    """Serve `app` with uvicorn until SIGINT or SIGTERM, with the HTTP limits of `settings`;
    on `sock` (a worker's inherited listening socket) or on IMROUTE_HOST:IMROUTE_PORT.
    `counts`: where the heads cut or refused are counted (the app's metrics')."""
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        # every line of the process, uvicorn's included, in one format with its time
        # (shared.logs); uvicorn's own config gave its lines no time, and ours none at all
        log_config=dict_config(settings.log_level, settings.log_format, "push-service"),
        access_log=False,
        http=head_deadline_protocol(
            settings.http_header_timeout_s, "auto", HeadLimits.from_settings(settings), counts
        ),
        # no WebSocket here: an upgrade request is answered as the HTTP request it is
        ws="none",
        timeout_keep_alive=settings.http_keepalive_timeout_s,
        timeout_graceful_shutdown=int(requests_grace_s(settings)),
        limit_concurrency=settings.http_max_concurrency,
        headers=RESPONSE_HEADERS,
    )
    # (After the Config, which sets up logging.) One line per unparsable request, no more.
    logging.getLogger("uvicorn.error").addFilter(ParseErrorLines())
    # uvicorn raises the SIGINT it captured once it has shut down; uvicorn.run()
    # swallows it the same way, so Ctrl-C prints no traceback.
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(config).run(sockets=None if sock is None else [sock])
