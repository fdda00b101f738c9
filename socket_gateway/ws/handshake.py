"""The opening handshake of a client connection, and what follows it until routed.

The HTTP request is parsed and answered by a short-lived `ServerProtocol` that is
dropped after the 101, so the request and its headers are not kept for the life of the
connection. After the 101 the token is checked (close 4401), the gateway's capacity
(close 4429), and the client goes into the local map, then its route into the registry
(close 1013 when the registry is unavailable, 4429 when its user is at the per-user cap).
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qs, urlsplit

from websockets.http11 import Request
from websockets.protocol import OPEN
from websockets.server import ServerProtocol

from shared.auth import verify_token
from shared.errors import AuthError, RegistryUnavailable, TooManyConnections
from socket_gateway.connections import ClientConn
from socket_gateway.ws.framing import FrameConn
from socket_gateway.ws.protocol import (
    CLOSE_FULL,
    CLOSE_INTERNAL,
    CLOSE_TRY_AGAIN,
    CLOSE_UNAUTHORIZED,
    MAX_CLIENT_FRAME,
    MAX_HANDSHAKE_BYTES,
    close_reason,
    user_cap_reason,
)

__all__ = ["HandshakeConn"]

log = logging.getLogger(__name__)


class HandshakeConn(FrameConn):
    """The connection layer from the first byte to a registered route."""

    __slots__ = ()

    def _on_head(self, data: bytes) -> None:
        """Bytes before the 101: gather the request head, then answer it."""
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
        if (
            url.path == "/metrics"
            and ep.metrics is not None
            and request.headers.get("Upgrade") is None
        ):
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
        since = query["since"][0] if query.get("since") else None
        try:
            uid = verify_token(ep._secret, token, ep._clock)
        except AuthError as exc:
            self.close(CLOSE_UNAUTHORIZED, close_reason(str(exc)))
        else:
            if ep.max_connections is not None and len(ep._conns) >= ep.max_connections:
                # Full: refused before anything is registered; dispatch sends clients
                # elsewhere once the fleet record shows it.
                self.close(CLOSE_FULL, f"gateway full ({ep.max_connections} connections)")
            else:
                self._accept(uid, since)
        if rest:
            self._receive(ws, rest)

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
        ep._spawn(self._register_route(conn, since))

    def _send_handshake(self, hs: ServerProtocol) -> None:
        """Write a refused handshake's response (and EOF), then wait for the client to go."""
        self._write_out(hs.data_to_send())
        self._arm(self._ep.timers.close_s)

    async def _register_route(self, conn: ClientConn, since: str | None) -> None:
        ep = self._ep
        try:
            await ep._register(conn.uid, conn.conn_id)
            if ep.resumer is not None and self._open:
                await ep.resumer.resume(conn, since)
        except TooManyConnections as exc:
            self.close(CLOSE_FULL, user_cap_reason(exc.limit))
            if since_logged := ep.limit_counts.user_cap.note(ep._clock.monotonic()):
                log.warning("refused %d connection(s) (4429): %s", since_logged, exc)
        except RegistryUnavailable as exc:
            log.warning("register or replay of %s failed: %s", conn.conn_id, exc)
            self.close(CLOSE_TRY_AGAIN, "route registry unavailable, retry later")
        except Exception:
            log.exception("register %s failed", conn.conn_id)
            self.close(CLOSE_INTERNAL, "internal error")
        finally:
            self._registering = False
            if self._lost and not ep._abandoned:
                ep._spawn(ep._unregister_conn(conn))
