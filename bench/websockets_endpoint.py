"""Baseline for bench.ws_endpoints: the gateway endpoint on the `websockets` asyncio server.

imroute's gateway used this until the sans-I/O endpoint (socket_gateway/ws/)
replaced it; it is kept here, unchanged in behaviour, so the comparison stays runnable.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.protocol import State

from shared.auth import verify_token
from shared.clock import Clock
from shared.errors import AuthError, InvalidInput, RegistryUnavailable
from shared.ids import ConnIdFactory
from shared.wire import PONG_FRAME, parse_client_frame
from socket_gateway.connections import ClientConn, LocalConnections

if TYPE_CHECKING:
    from asyncio import Transport

__all__ = ["CLOSE_UNAUTHORIZED", "WsEndpoint"]

log = logging.getLogger(__name__)

CLOSE_UNAUTHORIZED = 4401
CLOSE_UNSUPPORTED = 1003
CLOSE_POLICY = 1008
CLOSE_TRY_AGAIN = 1013
# Clients only send pings; anything bigger is junk and gets 1009 from the library.
MAX_CLIENT_FRAME = 4096


class WsSink:
    """Writes pre-built frame bytes straight to a connection's transport.

    Safe because the server never compresses (no per-connection deflate state)
    and every frame is written whole in one synchronous call, so library frames
    (pings, close) and ours never interleave.
    """

    __slots__ = ("_conn", "_transport")

    def __init__(self, conn: ServerConnection) -> None:
        self._conn = conn
        self._transport: Transport = conn.transport

    def is_open(self) -> bool:
        return self._conn.protocol.state is State.OPEN and not self._transport.is_closing()

    def buffered(self) -> int:
        return self._transport.get_write_buffer_size()

    def write(self, data: bytes) -> None:
        self._transport.write(data)

    def abort(self) -> None:
        self._transport.abort()

    def close(self, code: int, reason: str = "") -> None:
        """Start the closing handshake, in a task of the library's (no-op unless OPEN)."""
        if self._conn.protocol.state is State.OPEN:
            asyncio.get_running_loop().create_task(self._conn.close(code, reason))


@dataclass(slots=True, eq=False)
class WsEndpoint:
    """Authenticates clients, keeps them in the local map and in the route registry."""

    conns: LocalConnections
    secret: str = field(repr=False)
    clock: Clock
    conn_ids: ConnIdFactory
    register: Callable[[str, str], Awaitable[None]]
    unregister: Callable[[str, str], Awaitable[None]]
    accepting: bool = field(default=True, init=False)

    def serve(self, host: str, port: int) -> Awaitable[Server]:
        return serve(
            self._handle,
            host,
            port,
            process_request=self._process_request,
            compression=None,
            max_size=MAX_CLIENT_FRAME,
            max_queue=4,
            ping_interval=30,
            ping_timeout=30,
            server_header=None,
        )

    def _process_request(self, conn: ServerConnection, request: Request) -> Response | None:
        if urlsplit(request.path).path != "/ws":
            return conn.respond(404, "not found: the WebSocket endpoint is /ws?token=<JWT>\n")
        if not self.accepting:
            return conn.respond(503, "gateway is shutting down\n")
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        query = parse_qs(urlsplit(ws.request.path if ws.request else "").query)
        token = query["token"][0] if query.get("token") else None
        try:
            uid = verify_token(self.secret, token, self.clock)
        except AuthError as exc:
            await ws.close(CLOSE_UNAUTHORIZED, _reason(str(exc)))
            return
        conn = ClientConn(uid, self.conn_ids(), WsSink(ws))
        # Local map first, then Redis: a route never points at a connection this
        # gateway would report missing.
        self.conns.add(conn)
        try:
            try:
                await self.register(uid, conn.conn_id)
            except RegistryUnavailable as exc:
                log.warning("register %s failed: %s", conn.conn_id, exc)
                await ws.close(CLOSE_TRY_AGAIN, "route registry unavailable, retry later")
                return
            await self._serve_client(ws)
        finally:
            self.conns.remove(conn)
            try:
                await self.unregister(uid, conn.conn_id)
            except RegistryUnavailable as exc:
                # The route expires by its deadline; pushes to it meanwhile find it missing.
                log.warning("unregister %s failed: %s", conn.conn_id, exc)

    async def _serve_client(self, ws: ServerConnection) -> None:
        try:
            async for data in ws:
                if isinstance(data, bytes):
                    await ws.close(CLOSE_UNSUPPORTED, "binary frames are not supported")
                    return
                try:
                    parse_client_frame(data)
                except InvalidInput as exc:
                    await ws.close(CLOSE_POLICY, _reason(exc.message))
                    return
                ws.transport.write(PONG_FRAME)
        except ConnectionClosed:
            pass


def _reason(text: str) -> str:
    """Close reasons are limited to 123 bytes."""
    return text.encode()[:120].decode(errors="ignore")
