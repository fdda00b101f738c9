"""One client connection's state, its Sink side, and the frame phase after the 101.

`FrameConn` is the base layer of the connection object (`conn.WsConn`): it holds every
slot, writes pre-built push frames straight to the transport, feeds received bytes to
the sans-I/O `websockets` ServerProtocol, acts on the frames it yields, runs the closing
handshake, and arms the opening/closing deadlines.

Every frame a client sends counts against its connection's frame rate (`ratelimit`):
text, continuation and binary frames, and pings and pongs too, because the library
answers each ping with a pong that we would write, so a ping flood is not free. Past
the limit the connection is closed with 1008, and the pongs still queued are dropped.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import TYPE_CHECKING, cast

from websockets.frames import Frame, Opcode
from websockets.protocol import OPEN
from websockets.server import ServerProtocol

from shared.wire import PONG_FRAME
from socket_gateway.connections import ClientConn
from socket_gateway.ws.protocol import CLOSE_POLICY, CLOSE_UNSUPPORTED, client_text

if TYPE_CHECKING:
    from socket_gateway.ws.endpoint import WsEndpoint
    from socket_gateway.ws.ratelimit import FrameRate

__all__ = ["LIMITED_CLOSE_S", "READING_STOPPED", "RECEIVE_SLICE", "FrameConn"]

log = logging.getLogger(__name__)

# Received bytes are parsed this many at a time when frames are rate-limited: a slice
# holds at most a few hundred frames, and a legitimate frame is at most 4 KiB anyway.
RECEIVE_SLICE = 2048
# A connection closed for its frame rate is aborted this soon after its close frame.
LIMITED_CLOSE_S = 1.0
# `_tat` of a connection that stopped reading for good (over its frame rate).
READING_STOPPED = math.inf

_TEXT = Opcode.TEXT
_BINARY = Opcode.BINARY
_CONT = Opcode.CONT
_CLOSE = Opcode.CLOSE


class FrameConn(asyncio.Protocol):
    """One client connection: its state, its Sink, its frames and its closing."""

    # Every slot of the connection object lives here; the layers above add none.
    __slots__ = (
        "_alive",
        "_conn",
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

    def __init__(self, ep: WsEndpoint) -> None:
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
        # The frame-rate bucket's state (ratelimit.FrameRate.admit); 0.0 is full, and
        # READING_STOPPED once the connection was closed for going over its rate.
        self._tat = 0.0

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
        """Parse `data` and act on its frames; False once the connection reads no more."""
        ws.receive_data(data)
        # In the frame phase the library only produces frames.
        events = cast("list[Frame]", ws.events_received())
        self._alive = True
        if limit is not None and events:
            # Counted in every state: frames sent after a close are parsed too.
            tat = limit.admit(self._tat, self._ep._clock.monotonic(), len(events))
            if tat is None:
                self._too_many_frames(ws, limit)
                return False
            self._tat = tat
        was_open = self._open
        # Pongs to pings, close echoes, 1009 on oversized messages: the library's own.
        self._flush(ws)
        if was_open:
            for frame in events:
                if frame.opcode is _CLOSE:
                    break  # what follows a close is moot; what came before it counts
                self._on_frame(frame)  # an ack just before its close included
        t = self._transport
        if t is not None and t.get_write_buffer_size() > self._ep._conns.max_buffer:
            # A client that sends but does not read: same rule as for slow push consumers.
            self.abort()
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
        closes = self._ep.limit_counts.frame_rate
        since = closes.note(self._ep._clock.monotonic())
        if since:
            conn = self._conn
            log.warning(
                "closed %d connection(s) (1008) for sending frames faster than %g/s "
                "(burst %d), latest %s (%d in all)",
                since,
                limit.rate,
                limit.burst,
                conn.conn_id if conn is not None else "before its route",
                closes.total,
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
        self._timer = None
        self.abort()
