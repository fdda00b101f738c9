"""The gateway's side of the delivery link (README, "The delivery link").

gRPC's asyncio stack costs about 0.1 ms of CPU on each side per message, even on an
open stream: the message goes through its completion queue and the poller thread that
wakes the event loop. The link carries the same StreamCall and StreamReply as
DeliverStream, one frame each (shared.link_frames) on a TCP connection of its own, read
and answered in the event loop's own callback: every call a chunk of bytes completes is
answered before the next read, and all their replies go out in one write.

Who may open one: a router that asked the gRPC `Link` method (past the token check and
mTLS) for a ticket. The first frame must be a LinkHello carrying it; a ticket is good
once, for TICKET_S. Anything else (no hello within HELLO_TIMEOUT_S, a bad or used
ticket, a frame too big) is answered with an error StreamReply of call_id 0, counted,
logged (never the ticket) and the connection closed. With mTLS on, the link is TLS with
the same certs, a client cert required.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import ssl
from collections.abc import Callable
from typing import cast

from google.protobuf.message import DecodeError

from shared.clock import Clock
from shared.errors import PayloadTooLarge
from shared.link_frames import FrameReader, frame
from shared.proto import gateway_pb2
from socket_gateway.delivery import LinkCounts

__all__ = ["HELLO_TIMEOUT_S", "MAX_PRE_HELLO", "TICKET_S", "LinkServer", "Tickets"]

log = logging.getLogger(__name__)

TICKET_S = 10.0
MAX_TICKETS = 1024  # tickets issued and not yet used; past it the oldest go
HELLO_TIMEOUT_S = 5.0
HELLO_MAX_BYTES = 256  # a LinkHello is about 40
# Connections waiting for their hello at once, at most (a router opens one per process
# and gateway); past it a new one is refused at once, so strangers holding sockets open
# cannot use up the gateway's file descriptors.
MAX_PRE_HELLO = 256
LOG_EVERY_S = 10.0

Answer = Callable[[gateway_pb2.StreamCall], gateway_pb2.StreamReply]


class Tickets:
    """Single-use tickets; kept as their digests, so a look-up's timing says nothing of
    a ticket's bytes."""

    def __init__(self, clock: Clock, ttl_s: float = TICKET_S) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._live: dict[bytes, float] = {}  # digest -> expiry (monotonic), oldest first

    def issue(self) -> bytes:
        now = self._clock.monotonic()
        live = self._live
        for digest, expiry in list(live.items()):
            if expiry > now and len(live) < MAX_TICKETS:
                break
            del live[digest]
        ticket = secrets.token_bytes(32)
        live[hashlib.sha256(ticket).digest()] = now + self._ttl_s
        return ticket

    def redeem(self, ticket: bytes) -> bool:
        expiry = self._live.pop(hashlib.sha256(ticket).digest(), None)
        return expiry is not None and expiry > self._clock.monotonic()


class LinkServer:
    """Accepts links on a port of its own and answers their calls with `answer`."""

    def __init__(
        self, answer: Answer, tickets: Tickets, clock: Clock, frame_limit: int, counts: LinkCounts
    ) -> None:
        self.answer = answer
        self.tickets = tickets
        self.clock = clock
        self.frame_limit = frame_limit
        self.counts = counts
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[_LinkConn] = set()
        self._logged_at = float("-inf")
        self._unlogged = 0

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> int:
        """Listen; returns the bound port (port 0 picks one)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _LinkConn(self), host, port, ssl=tls)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening and close every link (their calls were all answered: a call is
        answered in the callback that read it)."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()

    def refused(self, peer: object, reason: str) -> None:
        self.counts.refused += 1
        self._unlogged += 1
        now = self.clock.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            log.warning(
                "refused %d delivery link(s), the last from %s: %s", self._unlogged, peer, reason
            )
            self._logged_at, self._unlogged = now, 0

    @property
    def waiting(self) -> int:
        """Connections waiting for their hello."""
        return len(self._conns) - self.counts.open

    def added(self, conn: _LinkConn) -> bool:
        """Whether `conn` may wait for its hello (not too many do already)."""
        if self.waiting >= MAX_PRE_HELLO:
            return False
        self._conns.add(conn)
        return True

    def removed(self, conn: _LinkConn, was_open: bool) -> None:
        if conn in self._conns:
            self._conns.discard(conn)
            if was_open:
                self.counts.open -= 1


def _error(code: str, text: str) -> bytes:
    return frame(
        gateway_pb2.StreamReply(call_id=0, error_code=code, error=text).SerializeToString()
    )


class _LinkConn(asyncio.Protocol):
    """One link: a hello first, then calls, each answered in the callback that read it."""

    def __init__(self, server: LinkServer) -> None:
        self._server = server
        self._reader = FrameReader(HELLO_MAX_BYTES)
        self._transport: asyncio.Transport | None = None
        self._open = False
        self._peer: object = None
        self._hello_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)
        self._peer = transport.get_extra_info("peername")
        if not self._server.added(self):
            self._refuse("RESOURCE_EXHAUSTED", f"over {MAX_PRE_HELLO} connections wait for a hello")
            return
        loop = asyncio.get_running_loop()
        self._hello_timer = loop.call_later(HELLO_TIMEOUT_S, self._late)

    def _late(self) -> None:
        self._refuse("DEADLINE_EXCEEDED", f"no hello within {HELLO_TIMEOUT_S:g}s")

    def _refuse(self, code: str, reason: str) -> None:
        self._server.refused(self._peer, reason)
        self._end(code, reason)

    def _end(self, code: str, reason: str) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(_error(code, reason))
            transport.close()

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except PayloadTooLarge as exc:
            if self._open:
                self._server.counts.bad += 1
                self._end("RESOURCE_EXHAUSTED", str(exc))
            else:
                self._refuse("UNAUTHENTICATED", f"no hello first ({exc})")
            return
        if not frames:
            return
        if not self._open:
            if not self._hello(frames[0]):
                return
            frames = frames[1:]
        out: list[bytes] = []
        answer = self._server.answer
        for payload in frames:
            try:
                call = gateway_pb2.StreamCall.FromString(payload)
            except DecodeError:
                self._server.counts.bad += 1
                if out:
                    self._write(out)
                self._end("INVALID_ARGUMENT", "a frame that is not a StreamCall")
                return
            out.append(frame(answer(call).SerializeToString()))
        self._server.counts.calls += len(out)
        if out:
            self._write(out)

    def _write(self, out: list[bytes]) -> None:
        assert self._transport is not None
        self._transport.writelines(out)

    def _hello(self, payload: bytes) -> bool:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        try:
            ticket = gateway_pb2.LinkHello.FromString(payload).ticket
        except DecodeError:
            ticket = b""
        if not ticket or not self._server.tickets.redeem(ticket):
            self._refuse("UNAUTHENTICATED", "no valid ticket (ask the gRPC Link method)")
            return False
        server = self._server
        self._open = True
        server.counts.opened += 1
        server.counts.open += 1
        self._reader.limit = server.frame_limit
        self._write([frame(gateway_pb2.StreamReply(call_id=0).SerializeToString())])
        return True

    # The router stops reading replies (stopped, or slow): read no more calls until it
    # catches up, rather than buffer their replies without bound.
    def pause_writing(self) -> None:
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        self._server.removed(self, self._open)
        self._transport = None

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
