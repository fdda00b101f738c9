"""The listening side: `WsEndpoint` serves `GET /ws?token=<JWT>` and shuts it down.

It holds what every connection shares (the local map, the token secret and rules, the
route registrar, the deadlines, the limits before the 101 and the count of sockets under
them, the refusal counts), the one keepalive task, and the short-lived register and
unregister tasks; an unregister always runs after its register has finished, so a route
is never written back after its removal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from shared.auth import TokenRules
from shared.clock import Clock
from shared.errors import RegistryUnavailable
from shared.ids import ConnIdFactory
from socket_gateway.acks import AckReporter
from socket_gateway.connections import ClientConn, LocalConnections
from socket_gateway.preauth import PreAuthPool
from socket_gateway.ws.admission import ConnectRate, HandshakeLimits, Refusals
from socket_gateway.ws.conn import WsConn
from socket_gateway.ws.framing import FrameConn
from socket_gateway.ws.keepalive import keepalive_loop
from socket_gateway.ws.protocol import WsTimers
from socket_gateway.ws.ratelimit import FrameRate, LimitCounts

if TYPE_CHECKING:  # the resumer's modules use this package's limits: no cycle at import
    from socket_gateway.resume import Resumer

__all__ = ["LISTEN_BACKLOG", "WsEndpoint", "WsServer"]

log = logging.getLogger(__name__)

LISTEN_BACKLOG = 1024


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
        self.limit_counts = limit_counts or LimitCounts()
        self.resumer = resumer  # replays to each new connection, when given
        self.acks = acks  # takes the clients' ack frames, when given (else ignored)
        self.max_connections = max_connections  # more are refused with HTTP 503
        self.token_rules = token_rules or TokenRules()
        self.limits = limits or HandshakeLimits()
        rate = self.limits.connect_rate_per_ip
        self.connect_rate = (
            None if rate is None else ConnectRate(rate, self.limits.connect_burst_per_ip)
        )
        self.refusals = Refusals(log)
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
        self._pending: PreAuthPool[FrameConn] = PreAuthPool(
            self.limits.max_pre_auth, self.limits.max_pre_auth_per_ip
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._closed = asyncio.Event()
        self._closing = False
        self._close_all = False
        self._abandoned = False  # shutdown gave up on pending registry calls
        self._keepalive_task: asyncio.Task[None] | None = None

    async def serve(self, host: str, port: int) -> WsServer:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: WsConn(self), host, port, backlog=LISTEN_BACKLOG)
        self._keepalive_task = loop.create_task(
            keepalive_loop(self.timers.ping_interval_s, lambda: self._live), name="ws-keepalive"
        )
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

    # ------------------------------------------------------------------ shutdown

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
