"""One client connection: `WsConn`, one `asyncio.Protocol` per client, from its first
byte to its last, and `EndpointState`, what the connections of one endpoint share.

A connection is one slotted object: the idle footprint is what `bench/ws_endpoints.py`
measures. It is also the connection's `Sink`: pushes are pre-built frame bytes written
straight to the transport by `LocalConnections.deliver`. Its life, in the order of this
module's sections:

- **the opening handshake.** The HTTP request is parsed and answered by a short-lived
  `ServerProtocol` that is dropped after the 101, so the request and its headers are not
  kept for the life of the connection. Everything a client can be refused for is decided
  before the 101, and answered with HTTP and a JSON body: a request head over its limits
  (431, 414: at most IMROUTE_HTTP_MAX_HEAD_BYTES of it is kept), the per-IP connect rate
  (429, answered at the accept, before the request), a draining gateway or a full one
  (503, both with Retry-After), the token (401). A refused socket is closed as soon as
  its answer is written. Until then it is counted, from its accept, under its address
  (`socket_gateway.preauth.PreAuthPool`). After the 101 the client goes into the local
  map, then its route into the registry (close 1013 when the registry is unavailable,
  4429 when its user is at the per-user cap: the check is the route write itself).
- **the frames.** The frame phase runs on a fresh sans-I/O `websockets` ServerProtocol
  created in the OPEN state; the connection feeds it the received bytes and acts on the
  frames it yields. Every frame a client sends counts against its connection's frame
  rate (`ratelimit`): text, continuation and binary frames, and pings and pongs too,
  because the library answers each ping with a pong that we would write, so a ping
  flood is not free. Past the limit the connection is closed with 1008, and the pongs
  still queued are dropped.
- **keepalive**, without a task per connection: ONE gateway-wide task
  (`keepalive_loop`) pings every open connection every `WsTimers.ping_interval_s`, and
  closes (1011) those that sent nothing since the previous ping. A round is spread over
  half the interval, in slices of PING_SLICE, and rounds start a fixed interval apart,
  so each connection is pinged once per interval at its own moment. All at once, 5000
  connections' pings came back as 5000 pongs in the same instant (and clients on one
  machine answered them all at once): a burst on both sides every 30 s, which stalled
  pushes on a small machine (docs/benchmarks/index.md).
- **the closing handshake**, and the opening/closing deadlines (`loop.call_later`
  handles that live only while a connection is opening or closing).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, cast
from urllib.parse import parse_qs, urlsplit

from websockets.exceptions import HeaderLineTooLong, RequestLineTooLong, TooManyHeaders
from websockets.frames import Frame, Opcode
from websockets.headers import parse_subprotocol
from websockets.http11 import Request, Response
from websockets.protocol import OPEN
from websockets.server import ServerProtocol

from shared.auth import TokenRules, verify_token
from shared.clock import Clock
from shared.errors import AuthError, RegistryUnavailable, TooManyConnections
from shared.http_heads import HeadRefusal, gather_head
from shared.ids import ConnIdFactory
from shared.periodic import Periodic
from shared.tasks import Background
from shared.throttled import ThrottledLine
from shared.wire import PONG_FRAME
from socket_gateway.acks import AckReporter
from socket_gateway.connections import ClientConn, LocalConnections
from socket_gateway.pacing import spread
from socket_gateway.preauth import PreAuthPool, client_key
from socket_gateway.ws.admission import ConnectRate, HandshakeLimits, Refusals, request_line_ok
from socket_gateway.ws.frames import FrameEnds, small_texts
from socket_gateway.ws.protocol import (
    CLOSE_FULL,
    CLOSE_GOING_AWAY,
    CLOSE_INTERNAL,
    CLOSE_POLICY,
    CLOSE_TRY_AGAIN,
    CLOSE_UNSUPPORTED,
    MAX_CLIENT_FRAME,
    PING_FRAME,
    QuietLog,
    WsTimers,
    client_text,
    json_refusal,
    select_subprotocol,
    token_of,
    user_cap_reason,
)
from socket_gateway.ws.ratelimit import FrameRate

if TYPE_CHECKING:  # the resumer's modules use this package's limits: no cycle at import
    from socket_gateway.resume import Resumer

__all__ = [
    "LIMITED_CLOSE_S",
    "PING_SLICE",
    "PING_SPREAD",
    "READING_STOPPED",
    "RECEIVE_SLICE",
    "RETRY_AFTER_S",
    "WRITE_HIGH",
    "WRITE_LOW",
    "EndpointState",
    "LimitCounts",
    "WsConn",
    "keepalive_loop",
    "ping_round",
]

log = logging.getLogger(__name__)


class LimitCounts:
    """What the client limits closed (frame rate) or refused (per-user cap): counts for
    /metrics, each with its throttled log line."""

    __slots__ = ("frame_rate", "user_cap")

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        # connections closed 1008 for sending frames faster than their FrameRate
        self.frame_rate = ThrottledLine(
            log,
            "closed %(n)d connection(s) (1008) for sending frames faster than %(rate)g/s "
            "(burst %(burst)d), latest %(conn)s (%(total)d in all)",
            now=now,
        )
        # new connections closed 4429 because their user was at the per-user cap
        self.user_cap = ThrottledLine(
            log, "refused %(n)d connection(s) (4429): %(reason)s", now=now
        )


# Write-side flow control: above HIGH we stop reading from that client (its pings and
# junk cannot grow our buffer) until the buffer drains below LOW. Pushes are bounded by
# LocalConnections.max_buffer (slow consumers are aborted).
WRITE_HIGH = 64 * 1024
WRITE_LOW = 16 * 1024

# Retry-After of a 503: about one fleet heartbeat, after which dispatch knows the
# gateway is full or draining and names another.
RETRY_AFTER_S = 2

# Received bytes are parsed this many at a time when frames are rate-limited: a slice
# holds at most a few hundred frames, and a legitimate frame is at most 4 KiB anyway.
RECEIVE_SLICE = 2048
# A connection closed for its frame rate is aborted this soon after its close frame.
LIMITED_CLOSE_S = 1.0
# `_tat` of a connection that stopped reading for good (over its frame rate).
READING_STOPPED = math.inf

PING_SLICE = 100  # connections pinged together
PING_SPREAD = 0.5  # a round's slices are spread over this share of the interval

# Never DEBUG (the request line and headers hold the token), nor a line per connection.
_LIB_LOG = QuietLog(logging.getLogger("websockets.server"))

# Headers of the library's own refusals that the JSON version keeps.
_KEPT_HEADERS = ("Upgrade", "Allow")

_TEXT = Opcode.TEXT
_BINARY = Opcode.BINARY
_CONT = Opcode.CONT
_CLOSE = Opcode.CLOSE


class EndpointState:
    """What the connections of one endpoint share, and where its shutdown stands.

    The local map, the token secret and rules, the route registrar, the deadlines, the
    limits before the 101 and the sockets under them, the refusal counts, the live
    connections, and the short-lived register and unregister tasks. The connections
    read and write it; `socket_gateway.ws.endpoint.WsEndpoint` adds listening and
    shutdown on top.
    """

    def __init__(
        self,
        conns: LocalConnections,
        secret: str,
        clock: Clock,
        conn_ids: ConnIdFactory,
        register: Callable[[str, str], Awaitable[None]],
        unregister: Callable[[str, str], Awaitable[None]],
        timers: WsTimers | None = None,
        max_connections: int | None = None,
        resumer: Resumer | None = None,
        token_rules: TokenRules | None = None,
        limits: HandshakeLimits | None = None,
        frame_rate: FrameRate | None = None,
        limit_counts: LimitCounts | None = None,
        acks: AckReporter | None = None,
    ) -> None:
        self.timers = timers or WsTimers()
        self.frame_rate = frame_rate  # each connection's client frames, when limited (1008)
        # what the client limits (frame rate, per-user cap) closed, for /metrics
        self.limit_counts = limit_counts or LimitCounts(clock.monotonic)
        self.resumer = resumer  # replays to each new connection, when given
        self.acks = acks  # takes the clients' ack frames, when given (else ignored)
        self.max_connections = max_connections  # more are refused with HTTP 503
        self.token_rules = token_rules or TokenRules()
        self.limits = limits or HandshakeLimits()
        rate = self.limits.connect_rate_per_ip
        self.connect_rate = (
            None if rate is None else ConnectRate(rate, self.limits.connect_burst_per_ip)
        )
        self.refusals = Refusals(log, now=clock.monotonic)
        self._conns = conns
        self._secret = secret
        self._clock = clock
        self._conn_ids = conn_ids
        self._register = register
        self._unregister = unregister
        self.accepting = True
        self._live: set[WsConn] = set()
        # Sockets accepted that have not had their 101, under their addresses: at most
        # limits.max_pre_auth, and limits.max_pre_auth_per_ip from one address.
        self._pending: PreAuthPool[WsConn] = PreAuthPool(
            self.limits.max_pre_auth, self.limits.max_pre_auth_per_ip
        )
        self._tasks = Background("a route registry call", log)  # register, unregister
        # Route registry calls Redis refused (an outage: every connection's), each line
        # once per 10 s with the count: a connection closed 1013 (try again), or a
        # closed one's route left to expire by its deadline.
        self.register_failed = ThrottledLine(
            log,
            "closed %(n)d connection(s) (1013): registering the route or replaying "
            "failed, the last %(conn)s: %(exc)s",
            now=clock.monotonic,
        )
        self.unregister_failed = ThrottledLine(
            log,
            "could not remove the routes of %(n)d closed connection(s) (they expire by "
            "their deadline), the last %(conn)s: %(exc)s",
            now=clock.monotonic,
        )
        self._idle = asyncio.Event()
        self._closed = asyncio.Event()
        self._closing = False
        self._close_all = False
        self._abandoned = False  # shutdown gave up on pending registry calls
        self._keepalive_task: asyncio.Task[None] | None = None

    async def _unregister_conn(self, conn: ClientConn) -> None:
        try:
            await self._unregister(conn.uid, conn.conn_id)
        except RegistryUnavailable as exc:
            # The route expires by its deadline; pushes to it meanwhile find it missing.
            self.unregister_failed.note(conn=conn.conn_id, exc=exc)
        except Exception:
            log.exception("unregister %s failed", conn.conn_id)


def _handshake_protocol() -> ServerProtocol:
    return ServerProtocol(
        select_subprotocol=select_subprotocol, max_size=MAX_CLIENT_FRAME, logger=_LIB_LOG
    )


class WsConn(asyncio.Protocol):
    """One client connection: handshake, frames, keepalive state, closing; also its Sink."""

    __slots__ = (
        "_alive",
        "_conn",
        "_ends",
        "_ep",
        "_frag",
        "_head",
        "_lost",
        "_open",
        "_registering",
        "_tat",
        "_timer",
        "_transport",
        "_ws",
    )

    def __init__(self, ep: EndpointState) -> None:
        self._ep = ep
        self._transport: asyncio.Transport | None = None
        # The handshake bytes received so far; None once the handshake is over.
        self._head: bytearray | None = bytearray()
        # The frame-phase protocol, from the 101 on.
        self._ws: ServerProtocol | None = None
        # OPEN and not being closed by us: pushes and pongs may be written.
        self._open = False
        # Received something since the last keepalive ping.
        self._alive = True
        self._conn: ClientConn | None = None
        self._registering = False
        self._lost = False
        self._timer: asyncio.TimerHandle | None = None
        # A fragmented text message being reassembled (bounded by MAX_CLIENT_FRAME).
        self._frag: bytearray | None = None
        # Where the client's frames end, through every read the library parses
        # (socket_gateway.ws.frames): a read of whole small text frames skips it.
        self._ends = FrameEnds()
        # The frame-rate bucket's state (ratelimit.FrameRate.admit); 0.0 is full, and
        # READING_STOPPED once the connection was closed for going over its rate.
        self._tat = 0.0

    # ------------------------------------------------------------------ transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        t = cast("asyncio.Transport", transport)
        self._transport = t
        ep = self._ep
        ep._live.add(self)
        if ep._closing or not self._pre_auth():
            t.abort()
            return
        t.set_write_buffer_limits(WRITE_HIGH, WRITE_LOW)
        # Its request line first (a silent socket goes soon), then the rest of its head.
        self._arm(min(ep.limits.request_line_s, ep.timers.handshake_s))

    def data_received(self, data: bytes) -> None:
        ws = self._ws
        if ws is not None:
            self._receive(ws, data)
            return
        self._on_head(data)

    def eof_received(self) -> bool | None:
        ws = self._ws
        if ws is not None:
            ws.receive_eof()
            # Anything the library still wants to write is moot: we close now.
            ws.data_to_send()
        self._open = False
        self._head = None
        return None  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._open = False
        self._head = None
        self._lost = True
        timer = self._timer
        if timer is not None:
            timer.cancel()
            self._timer = None
        ep = self._ep
        conn = self._conn
        if conn is not None:
            self._conn = None  # breaks the conn -> sink -> conn cycle
            ep._conns.remove(conn)
            # While the register is in flight its task unregisters when it is done.
            if not self._registering:
                ep._tasks.spawn(ep._unregister_conn(conn))
        ep._live.discard(self)
        ep._pending.discard(self)
        if not ep._live:
            ep._idle.set()

    def pause_writing(self) -> None:
        t = self._transport
        if t is not None and not t.is_closing():
            t.pause_reading()

    def resume_writing(self) -> None:
        t = self._transport
        if t is not None and not t.is_closing() and self._tat != READING_STOPPED:
            t.resume_reading()

    def going_away(self) -> None:
        """The gateway is shutting down: close with 1001 (abort one still opening)."""
        if self._open:
            self.close(CLOSE_GOING_AWAY, "gateway is shutting down")
        elif self._ws is None:
            self.abort()  # still in the handshake

    # ------------------------------------------------------------------ Sink

    def is_open(self) -> bool:
        return self._open

    def buffered(self) -> int:
        t = self._transport
        return t.get_write_buffer_size() if t is not None else 0

    def write(self, data: bytes) -> None:
        t = self._transport
        if t is not None:
            t.write(data)

    def abort(self) -> None:
        self._open = False
        t = self._transport
        if t is not None:
            t.abort()

    # ------------------------------------------------------------------ opening handshake

    def _pre_auth(self) -> bool:
        """A socket just accepted: its connect taken from its address's rate, then
        counted among those without a 101 under its address, or refused (False: to be
        aborted) when its address holds IMROUTE_WS_MAX_PRE_AUTH_PER_IP of them, or when
        all IMROUTE_WS_MAX_PRE_AUTH places are taken and its address holds the most.
        Otherwise, with every place taken, the address holding the most loses its oldest.
        Over the rate, it is answered 429 at once, in a free place: one over the rate
        never takes another's, so with every place taken it is refused too."""
        ep = self._ep
        t = self._transport
        assert t is not None
        now = ep._clock.monotonic()
        key = client_key(t.get_extra_info("peername"))
        rate = ep.connect_rate
        wait = rate.take(key, now) if rate is not None and key is not None else 0.0
        pool = ep._pending
        where = key or "?"
        kind = pool.refusal(where)
        if kind is not None:
            ep.refusals.note(kind, f"{pool.held(where)} open from {where}, {len(pool)} in all")
            return False
        if wait > 0 and pool.full:
            ep.refusals.note("rate_limited", f"from {where}, every place taken")
            return False
        evicted = pool.add(self, where)
        if evicted is not None:
            victim, holder = evicted
            ep.refusals.note("pre_auth_evicted", f"the oldest of {holder}'s")
            victim.abort()
        if wait > 0:
            assert rate is not None
            self._rate_limited(rate, where, wait, now)
        return True

    def _rate_limited(self, rate: ConnectRate, key: str, wait: float, now: float) -> None:
        """Answer 429 before the request, then FIN; what the client sends is read and
        dropped (closing with it unread would reset the connection, and could lose the
        answer) until it closes, or the request line's deadline cuts it."""
        self._ep.refusals.note("rate_limited", f"from {key}")
        self._head = None
        refusal = json_refusal(
            429,
            "rate_limited",
            f"over {rate.rate_per_s:g} connects/s from this address "
            "(IMROUTE_WS_CONNECT_RATE_PER_IP)",
            retry_after_s=max(1, math.ceil(wait)),
        )
        self._write_out([refusal.serialize(), b""])

    def _line_in(self) -> None:
        """The request line is in: the head's deadline (IMROUTE_WS_HANDSHAKE_TIMEOUT_S
        from the accept) replaces the request line's."""
        ep = self._ep
        extra = ep.timers.handshake_s - ep.limits.request_line_s
        timer = self._timer
        if extra > 0 and timer is not None:
            timer.cancel()
            self._timer = asyncio.get_running_loop().call_at(timer.when() + extra, self._expire)

    def _on_head(self, data: bytes) -> None:
        """Bytes before the 101: gather the request head within its limits (at most
        IMROUTE_HTTP_MAX_HEAD_BYTES are kept), then answer it. Only a request line earns
        the rest of the head's deadline: any other first line of a head still coming is
        answered 400 at once (a whole head is the parser's to judge)."""
        head = self._head
        if head is None:  # handshake refused, the response is on its way: ignore the rest
            return
        line_in = b"\n" in data and b"\n" not in head
        gathered = gather_head(head, data, self._ep.limits.head)
        if gathered is None:
            if line_in:
                line = head[: head.index(b"\n") + 1]
                if not request_line_ok(line):
                    self._head = None
                    self._refuse_line(line)
                    return
                self._line_in()
            return
        self._head = None
        if isinstance(gathered, HeadRefusal):
            self._refuse_head(gathered)
            return
        self._handshake(*gathered)

    def _refuse_line(self, line: bytes | bytearray) -> None:
        ep = self._ep
        shown = bytes(line[:40]).decode("ascii", "replace").rstrip("\r\n")
        ep.refusals.note("bad_request", f"a first line of {len(line)} B")
        hs = _handshake_protocol()
        hs.send_response(
            json_refusal(
                400,
                "bad_handshake",
                f"the first line is not a request line (GET <target> HTTP/1.1): {shown!r}",
            )
        )
        self._send_handshake(hs)

    def _refuse_head(self, refusal: HeadRefusal) -> None:
        """A head over a limit (ours, or the library's own): its JSON answer, counted."""
        ep = self._ep
        ep.refusals.note(refusal.error, refusal.detail)
        hs = _handshake_protocol()
        hs.send_response(json_refusal(refusal.status, refusal.error, refusal.detail))
        self._send_handshake(hs)

    def _handshake(self, head: bytes, rest: bytes) -> None:
        ep = self._ep
        hs = _handshake_protocol()
        hs.receive_data(head)
        events = hs.events_received()
        request = events[0] if events else None
        if not isinstance(request, Request):
            refusal = _library_refusal(hs.handshake_exc)
            if refusal is not None:
                self._refuse_head(refusal)
                return
            # Not a valid HTTP request: the library wrote an error response or an EOF.
            ep.refusals.note("bad_request", "not an HTTP request")
            self._send_handshake(hs)
            return
        try:
            url = urlsplit(request.path)
        except ValueError as exc:  # "//[": a target urlsplit cannot read (a bad IPv6 host)
            ep.refusals.note("bad_request", f"a target of {exc}")
            hs.send_response(
                json_refusal(400, "bad_handshake", f"the request target cannot be read: {exc}")
            )
            self._send_handshake(hs)
            return
        query = parse_qs(url.query)
        admitted: str | None = None
        if url.path != "/ws":  # /metrics is on the internal port (metrics_http)
            response = json_refusal(404, "not_found", "the WebSocket endpoint is /ws?token=<JWT>")
        else:
            # The library checks the upgrade (and picks the subprotocol) first: a request
            # that is no WebSocket handshake gets its 4xx whatever its token.
            response = hs.accept(request)
            if response.status_code != 101:
                response = _as_json(response)
            else:
                decided = self._admit(request, query)
                if isinstance(decided, Response):
                    response = decided
                else:
                    admitted = decided
        hs.send_response(response)
        if admitted is None:
            self._send_handshake(hs)
            return
        t = self._transport
        assert t is not None
        for data in hs.data_to_send():
            t.write(data)
        self._disarm()
        ep._pending.discard(self)
        # The frame phase runs on a fresh protocol; the request is not kept.
        ws = ServerProtocol(state=OPEN, max_size=MAX_CLIENT_FRAME)
        self._ws = ws
        self._open = True
        self._alive = True
        since = query["since"][0] if query.get("since") else None
        self._accept(admitted, since)
        if rest:
            self._receive(ws, rest)

    def _admit(self, request: Request, query: dict[str, list[str]]) -> Response | str:
        """The uid of a client that may have its 101, or the HTTP answer refusing it."""
        ep = self._ep
        if not ep.accepting:
            ep.refusals.note("not_accepting")
            return json_refusal(
                503,
                "unavailable",
                "gateway is draining or shutting down: ask /v1/dispatch for another",
                retry_after_s=RETRY_AFTER_S,
            )
        offered = [p for v in request.headers.get_all("Sec-WebSocket-Protocol")
                   for p in parse_subprotocol(v)]  # fmt: skip
        try:
            uid = verify_token(ep._secret, token_of(query, offered), ep._clock, ep.token_rules)
        except AuthError as exc:
            ep.refusals.note("unauthorized", str(exc))
            return json_refusal(401, "unauthorized", str(exc))
        if ep.max_connections is not None and len(ep._conns) >= ep.max_connections:
            # Refused before anything is registered; dispatch sends clients elsewhere
            # once the fleet record shows it.
            ep.refusals.note("full")
            return json_refusal(
                503,
                "gateway_full",
                f"gateway full ({ep.max_connections} connections): ask /v1/dispatch for another",
                retry_after_s=RETRY_AFTER_S,
            )
        return uid

    def _accept(self, uid: str, since: str | None) -> None:
        """An authenticated client: into the local map, then its route into Redis, then
        its replay (from `since`, or its inbox)."""
        ep = self._ep
        conn = ClientConn(uid, ep._conn_ids(), self)
        self._conn = conn
        if ep.resumer is not None:
            ep.resumer.attach(conn)
        # Local map first, then Redis: a route never points at a connection this
        # gateway would report missing.
        ep._conns.add(conn)
        self._registering = True
        ep._tasks.spawn(self._register_route(conn, since))

    def _send_handshake(self, hs: ServerProtocol) -> None:
        """Write a refused handshake's answer, then close once it is written: a refused
        socket is not held. The handshake deadline stays armed, for a client that does
        not read its answer."""
        self._write_out(hs.data_to_send())
        t = self._transport
        if t is not None:
            t.close()

    async def _register_route(self, conn: ClientConn, since: str | None) -> None:
        ep = self._ep
        try:
            await ep._register(conn.uid, conn.conn_id)
            if ep.resumer is not None and self._open:
                await ep.resumer.resume(conn, since)
        except TooManyConnections as exc:
            self.close(CLOSE_FULL, user_cap_reason(exc.limit))
            ep.limit_counts.user_cap.note(reason=exc)
        except RegistryUnavailable as exc:
            ep.register_failed.note(conn=conn.conn_id, exc=exc)
            self.close(CLOSE_TRY_AGAIN, "route registry unavailable, retry later")
        except Exception:
            log.exception("register %s failed", conn.conn_id)
            self.close(CLOSE_INTERNAL, "internal error")
        finally:
            self._registering = False
            if self._lost and not ep._abandoned:
                ep._tasks.spawn(ep._unregister_conn(conn))

    # ------------------------------------------------------------------ frames

    def _receive(self, ws: ServerProtocol, data: bytes) -> None:
        limit = self._ep.frame_rate
        if limit is None or len(data) <= RECEIVE_SLICE:
            self._receive_some(ws, data, limit)
            return
        # A flood's read holds thousands of frames: parse it a slice at a time, so that
        # no more than a slice's worth is parsed past the limit.
        for start in range(0, len(data), RECEIVE_SLICE):
            if not self._receive_some(ws, data[start : start + RECEIVE_SLICE], limit):
                return

    def _receive_some(self, ws: ServerProtocol, data: bytes, limit: FrameRate | None) -> bool:
        """Parse `data` and act on its frames; False once the connection reads no more.
        A read of whole small text frames (acks) is parsed without the library
        (socket_gateway.ws.frames); any other goes to it."""
        ends = self._ends
        texts = None
        if ends.at_boundary and self._frag is None and ws.state is OPEN:
            texts = small_texts(data)
        events: list[Frame] = []
        if texts is None:
            ws.receive_data(data)
            ends.feed(data)
            # In the frame phase the library only produces frames.
            events = cast("list[Frame]", ws.events_received())
        self._alive = True
        count = len(events) if texts is None else len(texts)
        if limit is not None and count:
            # Counted in every state: frames sent after a close are parsed too.
            tat = limit.admit(self._tat, self._ep._clock.monotonic(), count)
            if tat is None:
                self._too_many_frames(ws, limit)
                return False
            self._tat = tat
        was_open = self._open
        if texts is not None:
            if was_open:
                for text in texts:
                    self._on_text(text)
        else:
            # Pongs to pings, close echoes, 1009 on oversized messages: the library's own.
            self._flush(ws)
            if was_open:
                for frame in events:
                    if frame.opcode is _CLOSE:
                        break  # what follows a close is moot; what came before it counts
                    self._on_frame(frame)  # an ack just before its close included
        conns = self._ep._conns
        if self.buffered() > conns.max_buffer:
            # A client that sends but does not read: same rule as for slow push consumers.
            conns.abort_slow(self)
            return False
        return True

    def _too_many_frames(self, ws: ServerProtocol, limit: FrameRate) -> None:
        """Close with 1008 and stop reading: a flood is neither parsed nor answered."""
        if ws.state is OPEN:
            ws.data_to_send()  # still OPEN, so these are only pongs: not written
            self.close(
                CLOSE_POLICY, f"too many frames: at most {limit.rate:g}/s, burst {limit.burst}"
            )
        else:
            self._flush(ws)  # already closing: the close echo, if that is what is queued
        self._tat = READING_STOPPED
        t = self._transport
        if t is not None and not t.is_closing():
            t.pause_reading()
            if t.can_write_eof():
                # Our close frame, then FIN; the client need not answer, it is aborted soon.
                try:
                    t.write_eof()
                except (OSError, RuntimeError):
                    t.close()
        self._arm(min(self._ep.timers.close_s, LIMITED_CLOSE_S))
        conn = self._conn
        self._ep.limit_counts.frame_rate.note(
            rate=limit.rate,
            burst=limit.burst,
            conn=conn.conn_id if conn is not None else "before its route",
        )

    def _on_frame(self, frame: Frame) -> None:
        op = frame.opcode
        if op is _TEXT:
            if frame.fin:
                self._on_text(frame.data)
            else:
                self._frag = bytearray(frame.data)
        elif op is _CONT:
            frag = self._frag
            if frag is not None:
                frag += frame.data
                if frame.fin:
                    self._frag = None
                    self._on_text(frag)
        elif op is _BINARY:
            self.close(CLOSE_UNSUPPORTED, "binary frames are not supported")
        # PING, PONG and CLOSE were handled by the library.

    def _on_text(self, data: bytes | bytearray | memoryview) -> None:
        what = client_text(data)
        if what is None:
            t = self._transport
            if t is not None and self._open:  # nothing after our close frame
                t.write(PONG_FRAME)
        elif isinstance(what, str):  # an ack (never a close, even when it is bad)
            acks = self._ep.acks
            if acks is not None:
                acks.on_ack(self._conn, what)
        else:
            self.close(*what)

    # ------------------------------------------------------------------ keepalive

    def _keepalive(self) -> None:
        """A keepalive round reached this connection: ping it, or close it (1011) when it
        sent nothing since the previous round."""
        if not self._open:
            return  # opening or closing: a deadline timer is armed
        if not self._alive:
            self.close(CLOSE_INTERNAL, "keepalive ping timeout")
            return
        self._alive = False
        t = self._transport
        if t is not None:
            t.write(PING_FRAME)

    # ------------------------------------------------------------------ closing

    def close(self, code: int, reason: str = "") -> None:
        """Start the closing handshake (no-op unless OPEN)."""
        ws = self._ws
        if ws is None or ws.state is not OPEN or self._lost:
            return
        ws.send_close(code, reason)
        self._flush(ws)

    def _flush(self, ws: ServerProtocol) -> None:
        writes = ws.data_to_send()
        if writes:
            self._write_out(writes)
        if self._open and ws.state is not OPEN:
            self._open = False
            self._arm(self._ep.timers.close_s)

    def _write_out(self, writes: list[bytes]) -> None:
        t = self._transport
        if t is None or t.is_closing():
            return
        for data in writes:
            if data:
                t.write(data)
            elif t.can_write_eof():
                # Half-close; the client closes its side once it has read everything.
                try:
                    t.write_eof()
                except (OSError, RuntimeError):
                    t.close()
                return
            else:
                t.close()
                return

    # ------------------------------------------------------------------ deadlines

    def _arm(self, delay: float) -> None:
        timer = self._timer
        if timer is not None:
            timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(delay, self._expire)

    def _disarm(self) -> None:
        timer = self._timer
        if timer is not None:
            timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        """The handshake or the closing handshake took too long."""
        if self._ws is None and self._head is not None:
            # Still sending its request head (slowloris, or a silent socket).
            self._ep.refusals.note("handshake_timeout")
        self._timer = None
        self.abort()


async def keepalive_loop(interval_s: float, live: Callable[[], Collection[WsConn]]) -> None:
    """A round over the connections `live()` returns, starting every `interval_s`."""
    rounds = Periodic(
        "ws keepalive",
        lambda: ping_round(live(), spread_s=interval_s * PING_SPREAD),
        interval_s,
        log=log,
        at_once=False,
        fixed_rate=True,
    )
    await rounds.run()


async def ping_round(conns: Collection[WsConn], spread_s: float = 0.0) -> None:
    """Ping every open connection; close those silent since the previous round.

    In slices of PING_SLICE connections, `spread_s` apart in all (0: a loop turn
    between slices), so a round over many connections holds neither the loop nor the
    clients for long.
    """
    async for piece in spread(list(conns), PING_SLICE, spread_s):
        for c in piece:
            c._keepalive()


def _library_refusal(exc: Exception | None) -> HeadRefusal | None:
    """The library's own limits on a head (8 KiB a line, 128 fields), hit only where
    ours allow more, as the refusal ours would give; it answers them in plain text."""
    if isinstance(exc, RequestLineTooLong):
        return HeadRefusal(414, "uri_too_long", f"the request line is too long ({exc})")
    if isinstance(exc, HeaderLineTooLong | TooManyHeaders):
        return HeadRefusal(431, "headers_too_large", f"the request headers are too large ({exc})")
    return None


def _as_json(response: Response) -> Response:
    """The library's plain-text refusal of a bad handshake, as JSON like ours."""
    detail = bytes(response.body).decode(errors="replace").strip()
    refusal = json_refusal(response.status_code, "bad_handshake", detail)
    for name in _KEPT_HEADERS:
        value = response.headers.get(name)
        if value is not None:
            refusal.headers[name] = value
    return refusal
