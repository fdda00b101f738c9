"""The client-facing WebSocket endpoint `GET /ws?token=<JWT>`, without a task per connection.

Measured against the `websockets` asyncio server it replaced (bench/ws_endpoints.py,
10k idle connections): about 3.5 KiB per idle connection instead of 15.5, with the same
or better fan-out. It is built for that small idle footprint:

- one `asyncio.Protocol` object (with `__slots__`) per connection, driving the sans-I/O
  `websockets.server.ServerProtocol`: the library parses and validates the handshake and
  the frames (masking, control frames, UTF-8 close reasons, the 4096-byte message limit,
  no extensions so no compression) and produces pongs and close echoes; the connection
  object writes them out after every receive;
- the handshake runs on a short-lived `ServerProtocol` that is dropped after the 101, and
  the frame phase on a fresh one created in the OPEN state, so the parsed request and
  its headers are not kept for the life of the connection;
- the connection object is also the connection's `Sink`: pushes are pre-built frame bytes
  written straight to the transport by `LocalConnections.deliver`;
- no task and no keepalive task per connection: ONE gateway-wide task pings every
  connection every `WsTimers.ping_interval_s` and closes (1011) those that sent nothing since the
  previous ping; handshake and closing deadlines are `loop.call_later` handles that live
  only while a connection is opening or closing;
- registering and unregistering the route are short-lived tasks at connect and
  disconnect (the registry's calls are coroutines); an unregister always runs after the
  register has finished, so a route is never written back after its removal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import OPEN
from websockets.server import ServerProtocol

from shared.auth import verify_token
from shared.clock import Clock
from shared.errors import AuthError, InvalidInput, RegistryUnavailable
from shared.ids import ConnIdFactory
from shared.wire import PONG_FRAME, parse_client_frame
from socket_gateway.connections import ClientConn, LocalConnections

__all__ = ["CLOSE_UNAUTHORIZED", "WsEndpoint", "WsServer"]

log = logging.getLogger(__name__)

CLOSE_GOING_AWAY = 1001
CLOSE_UNSUPPORTED = 1003
CLOSE_INVALID_DATA = 1007
CLOSE_POLICY = 1008
CLOSE_INTERNAL = 1011
CLOSE_TRY_AGAIN = 1013
CLOSE_UNAUTHORIZED = 4401
CLOSE_FULL = 4429
# Clients only send pings; anything bigger is junk and gets 1009 from the library.
MAX_CLIENT_FRAME = 4096
# The request line and headers of the opening handshake, at most.
MAX_HANDSHAKE_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class WsTimers:
    """The endpoint's deadlines, injected so tests (and operators) can shorten them."""

    handshake_s: float = 10.0  # TCP accept -> 101 sent
    close_s: float = 10.0  # close frame sent -> TCP closed by the client
    ping_interval_s: float = 30.0  # gateway-wide keepalive round; silent a whole round -> 1011
    shutdown_s: float = 5.0  # close(close_connections=True) -> remaining ones are aborted


PING_SLICE = 1000  # connections pinged per loop turn
LISTEN_BACKLOG = 1024
# Write-side flow control: above HIGH we stop reading from that client (its pings and
# junk cannot grow our buffer) until the buffer drains below LOW. Pushes are bounded by
# LocalConnections.max_buffer (slow consumers are aborted).
WRITE_HIGH = 64 * 1024
WRITE_LOW = 16 * 1024

# An unmasked ping with an empty payload, as ServerProtocol.send_ping(b"") would write it
# (no extensions are ever negotiated, so the bytes are always these).
PING_FRAME = b"\x89\x00"

_TEXT = Opcode.TEXT
_BINARY = Opcode.BINARY
_CONT = Opcode.CONT


class _WsConn(asyncio.Protocol):
    """One client connection: handshake, frames, keepalive state; also its Sink."""

    __slots__ = (
        "_alive",
        "_conn",
        "_ep",
        "_frag",
        "_head",
        "_lost",
        "_open",
        "_registering",
        "_timer",
        "_transport",
        "_ws",
    )

    def __init__(self, ep: WsEndpoint) -> None:
        self._ep = ep
        self._transport: asyncio.Transport | None = None
        # The handshake bytes received so far; None once the handshake is over.
        self._head: bytes | None = b""
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

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        t = cast("asyncio.Transport", transport)
        self._transport = t
        ep = self._ep
        ep._live.add(self)
        if ep._closing:
            t.abort()
            return
        t.set_write_buffer_limits(WRITE_HIGH, WRITE_LOW)
        self._arm(self._ep.timers.handshake_s)

    def data_received(self, data: bytes) -> None:
        ws = self._ws
        if ws is not None:
            self._receive(ws, data)
            return
        head = self._head
        if head is None:  # handshake refused, the response is on its way: ignore the rest
            return
        head += data
        end = head.find(b"\r\n\r\n")
        if end < 0:
            if len(head) > MAX_HANDSHAKE_BYTES:
                self._head = None
                hs = ServerProtocol(max_size=MAX_CLIENT_FRAME)
                hs.send_response(hs.reject(431, "request header fields too large\n"))
                self._send_handshake(hs)
            else:
                self._head = head
            return
        self._head = None
        self._handshake(head[: end + 4], head[end + 4 :])

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
                ep._spawn(ep._unregister_conn(conn))
        ep._live.discard(self)
        if not ep._live:
            ep._idle.set()

    def pause_writing(self) -> None:
        t = self._transport
        if t is not None and not t.is_closing():
            t.pause_reading()

    def resume_writing(self) -> None:
        t = self._transport
        if t is not None and not t.is_closing():
            t.resume_reading()

    # ------------------------------------------------------------------ handshake

    def _handshake(self, head: bytes, rest: bytes) -> None:
        ep = self._ep
        hs = ServerProtocol(max_size=MAX_CLIENT_FRAME)
        hs.receive_data(head)
        events = hs.events_received()
        request = events[0] if events else None
        if not isinstance(request, Request):
            # Not a valid HTTP request: the library wrote an error response or an EOF.
            self._send_handshake(hs)
            return
        url = urlsplit(request.path)
        if url.path == "/metrics" and ep.metrics is not None and request.headers.get(
            "Upgrade"
        ) is None:
            # Prometheus scrapes the gateway on its WebSocket port: a plain GET, answered
            # and closed (the text exposition format is text/plain).
            response = hs.reject(200, ep.metrics())
        elif url.path != "/ws":
            response = hs.reject(404, "not found: the WebSocket endpoint is /ws?token=<JWT>\n")
        elif not ep.accepting:
            response = hs.reject(503, "gateway is shutting down\n")
        else:
            response = hs.accept(request)
        hs.send_response(response)
        if response.status_code != 101:
            self._send_handshake(hs)
            return
        t = self._transport
        assert t is not None
        for data in hs.data_to_send():
            t.write(data)
        self._disarm()
        # The frame phase runs on a fresh protocol; the request is not kept.
        ws = ServerProtocol(state=OPEN, max_size=MAX_CLIENT_FRAME)
        self._ws = ws
        self._open = True
        self._alive = True
        query = parse_qs(url.query)
        token = query["token"][0] if query.get("token") else None
        try:
            uid = verify_token(ep._secret, token, ep._clock)
        except AuthError as exc:
            self.close(CLOSE_UNAUTHORIZED, _reason(str(exc)))
        else:
            if ep.max_connections is not None and len(ep._conns) >= ep.max_connections:
                # Full: refused before anything is registered; dispatch sends clients
                # elsewhere once the fleet record shows it.
                self.close(CLOSE_FULL, f"gateway full ({ep.max_connections} connections)")
            else:
                self._accept(uid)
        if rest:
            self._receive(ws, rest)

    def _accept(self, uid: str) -> None:
        """An authenticated client: into the local map, then its route into Redis."""
        ep = self._ep
        conn = ClientConn(uid, ep._conn_ids(), self)
        self._conn = conn
        # Local map first, then Redis: a route never points at a connection this
        # gateway would report missing.
        ep._conns.add(conn)
        self._registering = True
        ep._spawn(self._register_route(conn))

    def _send_handshake(self, hs: ServerProtocol) -> None:
        """Write a refused handshake's response (and EOF), then wait for the client to go."""
        self._write_out(hs.data_to_send())
        self._arm(self._ep.timers.close_s)

    # ------------------------------------------------------------------ frames

    def _receive(self, ws: ServerProtocol, data: bytes) -> None:
        ws.receive_data(data)
        # In the frame phase the library only produces frames.
        events = cast("list[Frame]", ws.events_received())
        self._alive = True
        # Pongs to pings, close echoes, 1009 on oversized messages: the library's own.
        self._flush(ws)
        for frame in events:
            if not self._open:
                break  # closing: the rest is moot
            self._on_frame(frame)
        t = self._transport
        if t is not None and t.get_write_buffer_size() > self._ep._conns.max_buffer:
            # A client that sends but does not read: same rule as for slow push consumers.
            self.abort()

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
        try:
            text = bytes(data).decode()
        except UnicodeDecodeError:
            self.close(CLOSE_INVALID_DATA, "text frames must be UTF-8")
            return
        try:
            parse_client_frame(text)
        except InvalidInput as exc:
            self.close(CLOSE_POLICY, _reason(exc.message))
            return
        t = self._transport
        if t is not None:
            t.write(PONG_FRAME)

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

    # ------------------------------------------------------------------ timers, keepalive

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
        self._timer = None
        self.abort()

    def _keepalive(self) -> None:
        if not self._open:
            return  # opening or closing: a deadline timer is armed
        if not self._alive:
            self.close(CLOSE_INTERNAL, "keepalive ping timeout")
            return
        self._alive = False
        t = self._transport
        if t is not None:
            t.write(PING_FRAME)

    def _going_away(self) -> None:
        if self._open:
            self.close(CLOSE_GOING_AWAY, "gateway is shutting down")
        elif self._ws is None:
            self.abort()  # still in the handshake

    # ------------------------------------------------------------------ registry

    async def _register_route(self, conn: ClientConn) -> None:
        ep = self._ep
        try:
            await ep._register(conn.uid, conn.conn_id)
        except RegistryUnavailable as exc:
            log.warning("register %s failed: %s", conn.conn_id, exc)
            self.close(CLOSE_TRY_AGAIN, "route registry unavailable, retry later")
        except Exception:
            log.exception("register %s failed", conn.conn_id)
            self.close(CLOSE_INTERNAL, "internal error")
        finally:
            self._registering = False
            if self._lost and not ep._abandoned:
                ep._spawn(ep._unregister_conn(conn))


class WsServer:
    """What `WsEndpoint.serve()` returns; shaped like the `websockets` Server."""

    def __init__(self, ep: WsEndpoint, server: asyncio.AbstractServer) -> None:
        self._ep = ep
        self._server = server
        self.sockets: list[socket.socket] = list(getattr(server, "sockets", ()) or ())

    def close(self, close_connections: bool = True) -> None:
        """Stop listening; with close_connections, close every connection with 1001."""
        self._ep._close(self._server, close_connections)

    async def wait_closed(self) -> None:
        """Wait until close() was called and every connection (and its unregister) is done."""
        await self._ep._wait_closed(self._server)


class WsEndpoint:
    """Authenticates clients, keeps them in the local map and in the route registry."""

    def __init__(
        self,
        conns: LocalConnections,
        secret: str,
        clock: Clock,
        conn_ids: ConnIdFactory,
        register: Callable[[str, str], Awaitable[None]],
        unregister: Callable[[str, str], Awaitable[None]],
        timers: WsTimers | None = None,
        metrics: Callable[[], str] | None = None,
        max_connections: int | None = None,
    ) -> None:
        self.timers = timers or WsTimers()
        self.max_connections = max_connections  # more are refused with close 4429
        self.metrics = metrics  # GET /metrics: Prometheus text, when given
        self._conns = conns
        self._secret = secret
        self._clock = clock
        self._conn_ids = conn_ids
        self._register = register
        self._unregister = unregister
        self.accepting = True
        self._live: set[_WsConn] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._closed = asyncio.Event()
        self._closing = False
        self._close_all = False
        self._abandoned = False  # shutdown gave up on pending registry calls
        self._keepalive_task: asyncio.Task[None] | None = None

    async def serve(self, host: str, port: int) -> WsServer:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _WsConn(self), host, port, backlog=LISTEN_BACKLOG)
        self._keepalive_task = loop.create_task(self._keepalive_loop(), name="ws-keepalive")
        return WsServer(self, server)

    # ------------------------------------------------------------------ internals

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _unregister_conn(self, conn: ClientConn) -> None:
        try:
            await self._unregister(conn.uid, conn.conn_id)
        except RegistryUnavailable as exc:
            # The route expires by its deadline; pushes to it meanwhile find it missing.
            log.warning("unregister %s failed: %s", conn.conn_id, exc)
        except Exception:
            log.exception("unregister %s failed", conn.conn_id)

    async def _keepalive_loop(self) -> None:
        while True:
            await asyncio.sleep(self.timers.ping_interval_s)
            await self._ping_round()

    async def _ping_round(self) -> None:
        """Ping every open connection; close those silent since the previous round.

        In slices of PING_SLICE connections with a loop turn between them, so a round
        over many connections does not hold the loop (and pushes) for long.
        """
        snapshot = list(self._live)
        for start in range(0, len(snapshot), PING_SLICE):
            if start:
                await asyncio.sleep(0)
            for c in snapshot[start : start + PING_SLICE]:
                c._keepalive()

    def _close(self, server: asyncio.AbstractServer, close_connections: bool) -> None:
        if self._closing:
            return
        self._closing = True
        self._close_all = close_connections
        self.accepting = False
        server.close()
        if self._keepalive_task is not None:
            self._keepalive_task.cancel()
        if close_connections:
            for c in list(self._live):
                c._going_away()
        self._closed.set()

    async def _wait_closed(self, server: asyncio.AbstractServer) -> None:
        await self._closed.wait()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timers.shutdown_s if self._close_all else None
        while self._live:
            self._idle.clear()
            timeout = None if deadline is None else max(0.0, deadline - loop.time())
            try:
                await asyncio.wait_for(self._idle.wait(), timeout)
            except TimeoutError:
                break
        if self._live:
            log.warning("aborting %d connections that did not close in time", len(self._live))
            for c in list(self._live):
                c.abort()
            for _ in range(100):  # connection_lost runs on the next loop iterations
                if not self._live:
                    break
                await asyncio.sleep(0.01)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 1.0)
        if self._keepalive_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive_task
        # Register/unregister calls still in flight (each unregister follows its register).
        while self._tasks:
            timeout = None if deadline is None else max(0.5, deadline - loop.time())
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            if pending and deadline is not None:
                log.warning("abandoning %d route registry calls", len(pending))
                self._abandoned = True
                for task in pending:
                    task.cancel()
                await asyncio.wait(pending, timeout=1.0)
                break


def _reason(text: str) -> str:
    """Close reasons are limited to 123 bytes."""
    return text.encode()[:120].decode(errors="ignore")
