"""The listening side: `WsEndpoint` serves `GET /ws?token=<JWT>` and shuts it down.

What every connection shares (`conn.EndpointState`: the local map, the token secret and
rules, the route registrar, the deadlines, the limits before the 101, the refusal
counts, the live connections) is the connection module's; the endpoint adds the
listening socket, the one keepalive task, and a shutdown that waits for the short-lived
register and unregister tasks (an unregister always runs after its register has
finished, so a route is never written back after its removal).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

from socket_gateway.ws.conn import EndpointState, WsConn, keepalive_loop

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


class WsEndpoint(EndpointState):
    """Authenticates clients, keeps them in the local map and in the route registry."""

    async def serve(self, host: str, port: int) -> WsServer:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: WsConn(self), host, port, backlog=LISTEN_BACKLOG)
        self._keepalive_task = loop.create_task(
            keepalive_loop(self.timers.ping_interval_s, lambda: self._live), name="ws-keepalive"
        )
        return WsServer(self, server)

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
                c.going_away()
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
        timeout = None if deadline is None else deadline - loop.time()
        pending = await self._tasks.drain(timeout, floor_s=0.5)
        if pending:
            log.warning("abandoning %d route registry calls", pending)
            self._abandoned = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._tasks.cancel(), 1.0)
