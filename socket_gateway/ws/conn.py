"""The connection object: one `asyncio.Protocol` per client, built from its layers.

`WsConn` adds the transport callbacks to `handshake.HandshakeConn` (opening, token,
registration) and `keepalive.KeepaliveConn` (the pings), both on `framing.FrameConn`
(state, Sink, frames, closing). The layers add no slots, so a connection stays one
slotted object: the idle footprint is what `bench/ws_endpoints.py` measures.
"""

from __future__ import annotations

import asyncio
from typing import cast

from socket_gateway.ws.framing import READING_STOPPED
from socket_gateway.ws.handshake import HandshakeConn
from socket_gateway.ws.keepalive import KeepaliveConn
from socket_gateway.ws.protocol import CLOSE_GOING_AWAY

__all__ = ["WRITE_HIGH", "WRITE_LOW", "WsConn"]

# Write-side flow control: above HIGH we stop reading from that client (its pings and
# junk cannot grow our buffer) until the buffer drains below LOW. Pushes are bounded by
# LocalConnections.max_buffer (slow consumers are aborted).
WRITE_HIGH = 64 * 1024
WRITE_LOW = 16 * 1024


class WsConn(HandshakeConn, KeepaliveConn):
    """One client connection: handshake, frames, keepalive state; also its Sink."""

    __slots__ = ()

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
                ep._spawn(ep._unregister_conn(conn))
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

    def _going_away(self) -> None:
        if self._open:
            self.close(CLOSE_GOING_AWAY, "gateway is shutting down")
        elif self._ws is None:
            self.abort()  # still in the handshake
