"""The gateway's side of the delivery link (docs/architecture/gateway-calls.md).

gRPC's asyncio stack costs about 0.1 ms of CPU on each side per message, even on an
open stream: the message goes through its completion queue and the poller thread that
wakes the event loop. The link carries the calls of a DeliverMany as StreamCall and
StreamReply, one frame each (shared.link_frames) on a TCP connection of its own, read
and answered in the event loop's own callback: every call a chunk of bytes completes is
answered before the next read, and all their replies go out in one write.

Who may open one: a router that asked the gRPC `Link` method (past the token check and
mTLS) for a ticket (socket_gateway.link_tickets). The first frame must be a LinkHello
carrying it. Anything else (no hello within HELLO_TIMEOUT_S, a bad or used ticket, a
frame too big) is answered with an error StreamReply of call_id 0, counted, logged
(never the ticket) and the connection closed. With mTLS on, the link is TLS with the
same certs, a client cert required.

Connections are accepted by a task of ours (socket_gateway.acceptor, on every address
of the host, as the event loop's servers), not by a server of the event loop's, so that
each one is counted and timed from its TCP accept, before its TLS handshake: at most
MAX_PRE_HELLO wait for their hello, MAX_PRE_HELLO_PER_PEER from one address, and with
every place taken the address holding the most loses its oldest
(`socket_gateway.preauth.PreAuthPool`); the hello deadline runs from the accept, the
handshake included. The loop then runs the TLS handshake (`connect_accepted_socket`),
with its own fast TLS transport as before. A connection cut before the loop took its
socket over (its task not started yet) is closed and forgotten here: a task cancelled
before it starts runs none of its code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable
from typing import cast

from google.protobuf.message import DecodeError

from shared.clock import Clock
from shared.errors import PayloadTooLarge
from shared.link_frames import FrameReader, frame
from shared.proto import gateway_pb2
from shared.throttled import ThrottledLine
from socket_gateway.acceptor import Acceptor
from socket_gateway.delivery import BadCall, DeliverService, LinkCounts
from socket_gateway.link_tickets import MAX_TICKETS, TICKET_S, Tickets
from socket_gateway.preauth import PER_KEY_CAP, PreAuthPool, client_key

__all__ = [
    "HELLO_TIMEOUT_S",
    "MAX_PRE_HELLO",
    "MAX_PRE_HELLO_PER_PEER",
    "MAX_TICKETS",
    "TICKET_S",
    "LinkServer",
    "Tickets",
]

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 5.0  # TCP accept -> hello, the TLS handshake included
HELLO_MAX_BYTES = 256  # a LinkHello is about 40
# Connections waiting for their hello at once, at most (a router opens one per process
# and gateway); past it a new one is refused at once, so strangers holding sockets open
# cannot use up the gateway's file descriptors.
MAX_PRE_HELLO = 256
# ... and from one address (IPv4, or IPv6 /64): a push-service host's processes (one
# link each; as many as its cores by default) all reconnecting at once fit.
MAX_PRE_HELLO_PER_PEER = 64
LOG_EVERY_S = 10.0  # refused strangers: one line at most this often, with the count
# Connections the kernel completes before the link accepts them. A flood of strangers
# outruns the accept loop for a moment; past a full queue the kernel drops the
# handshake's last ACK and a push service's link waits on SYN-ACK retries (1, 2, 4 s...).
BACKLOG = 1024

Answer = Callable[[gateway_pb2.StreamCall], gateway_pb2.StreamReply]


def call_answerer(service: DeliverService) -> Answer:
    """The link's answer to a StreamCall: the delivery core's `deliver_call`, as gRPC
    DeliverMany's, but a refused call leaves the link open."""
    deliver_call = service.deliver_call

    def answer(call: gateway_pb2.StreamCall) -> gateway_pb2.StreamReply:
        # The deadline travels as a duration, like gRPC's: it starts when the call is read.
        left = call.timeout_ms / 1000 if call.timeout_ms else None
        try:
            replies = deliver_call(call.batches, left)
        except BadCall as exc:
            return gateway_pb2.StreamReply(
                call_id=call.call_id, error_code="INVALID_ARGUMENT", error=exc.problem
            )
        return gateway_pb2.StreamReply(call_id=call.call_id, replies=replies)

    return answer


class LinkServer:
    """Accepts links on a port of its own and answers their calls with `answer`
    (`call_answerer`'s, but for tests)."""

    def __init__(
        self, answer: Answer, tickets: Tickets, clock: Clock, frame_limit: int, counts: LinkCounts
    ) -> None:
        self.answer = answer
        self.tickets = tickets
        self.clock = clock
        self.frame_limit = frame_limit
        self.counts = counts
        self.tls: ssl.SSLContext | None = None
        self._acceptor = Acceptor(self._accepted, clock, "delivery link")
        self._conns: set[_LinkConn] = set()
        # Those without their hello yet (their TLS handshake included), by peer address.
        self._pre_hello: PreAuthPool[_LinkConn] = PreAuthPool(MAX_PRE_HELLO, MAX_PRE_HELLO_PER_PEER)
        self._refusal_line = ThrottledLine(
            log,
            "refused %(n)d delivery link(s), the last from %(peer)s: %(reason)s",
            every_s=LOG_EVERY_S,
            now=clock.monotonic,
        )

    async def start(self, host: str | None, port: int, tls: ssl.SSLContext | None = None) -> int:
        """Listen on every address of `host` ("" or None: every interface); returns the
        bound port (port 0 picks one)."""
        self.tls = tls
        return await self._acceptor.listen(host, port, BACKLOG)

    def _accepted(self, sock: socket.socket, peer: object) -> None:
        _LinkConn(self, peer).accepted(sock)

    async def close(self) -> None:
        """Stop listening and close every link (their calls were all answered: a call is
        answered in the callback that read it)."""
        await self._acceptor.close()
        for conn in list(self._conns):
            conn.close()

    def refused(self, peer: object, reason: str) -> None:
        self.counts.refused += 1
        self._refusal_line.note(peer=peer, reason=reason)

    @property
    def waiting(self) -> int:
        """Connections waiting for their hello (or in their TLS handshake)."""
        return len(self._pre_hello)

    def added(self, conn: _LinkConn, peer: str) -> str | None:
        """None when `conn`, from `peer`'s address, may wait for its hello (in place of
        the oldest of the address holding the most, when every place is taken); else
        why not."""
        pool = self._pre_hello
        why = pool.refusal(peer)
        if why == PER_KEY_CAP:
            return f"over {pool.max_per_key} connections from {peer} wait for a hello"
        if why is not None:
            return f"over {pool.max_total} connections wait for a hello"
        evicted = pool.add(conn, peer)
        self._conns.add(conn)
        if evicted is not None:
            victim, holder = evicted
            victim.refuse(
                "RESOURCE_EXHAUSTED",
                f"{pool.max_total} connections wait for a hello, the most from {holder}",
            )
        return None

    def greeted(self, conn: _LinkConn) -> None:
        self._pre_hello.discard(conn)

    def removed(self, conn: _LinkConn, was_open: bool) -> None:
        self._pre_hello.discard(conn)
        if conn in self._conns:
            self._conns.discard(conn)
            if was_open:
                self.counts.open -= 1


def _error(code: str, text: str) -> bytes:
    return frame(
        gateway_pb2.StreamReply(call_id=0, error_code=code, error=text).SerializeToString()
    )


def _turn_away(sock: socket.socket, answer: bytes | None) -> None:
    """Close a socket refused at its accept, after `answer` (plain text only: a TLS
    client could not read it) if the socket takes it at once."""
    with contextlib.suppress(OSError):
        if answer is not None:
            sock.setblocking(False)
            sock.send(answer)
    sock.close()


class _LinkConn(asyncio.Protocol):
    """One link: a hello first, then calls, each answered in the callback that read it."""

    def __init__(self, server: LinkServer, peer: object) -> None:
        self._server = server
        self._peer = peer
        self._reader = FrameReader(HELLO_MAX_BYTES)
        self._transport: asyncio.Transport | None = None
        # The socket until the loop takes it over (when `_opening` starts), then the
        # task taking it over until connection_made (TLS)
        self._sock: socket.socket | None = None
        self._opening: asyncio.Task[None] | None = None
        self._open = False
        self._hello_timer: asyncio.TimerHandle | None = None

    def accepted(self, sock: socket.socket) -> None:
        """Counted under its peer's address, or refused at once; its hello deadline
        starts now, and the loop takes the socket over (TLS first, when on)."""
        server = self._server
        why = server.added(self, client_key(self._peer) or "?")
        if why is not None:
            server.refused(self._peer, why)
            _turn_away(sock, None if server.tls else _error("RESOURCE_EXHAUSTED", why))
            return
        self._sock = sock
        try:
            loop = asyncio.get_running_loop()
            self._hello_timer = loop.call_later(HELLO_TIMEOUT_S, self._late)
            self._opening = loop.create_task(self._take_over(server.tls))
        except BaseException:
            self._drop(None)
            raise

    async def _take_over(self, tls: ssl.SSLContext | None) -> None:
        loop = asyncio.get_running_loop()
        timeout = None if tls is None else HELLO_TIMEOUT_S
        sock, self._sock = self._sock, None
        assert sock is not None
        # Batches are small writes that must go at once: uvloop sets this on the
        # transport it makes, the stdlib loop does not on an accepted socket.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await loop.connect_accepted_socket(
                lambda: self, sock, ssl=tls, ssl_handshake_timeout=timeout
            )
        except asyncio.CancelledError:  # cut in its handshake (late, evicted), or shutdown
            self._gone()
            raise
        except (OSError, TimeoutError, EOFError) as exc:  # ssl.SSLError is an OSError
            self._server.refused(self._peer, f"TLS handshake failed ({type(exc).__name__})")
            self._gone()
        finally:
            self._opening = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)

    def _late(self) -> None:
        self._hello_timer = None
        self.refuse("DEADLINE_EXCEEDED", f"no hello within {HELLO_TIMEOUT_S:g}s")

    def refuse(self, code: str, reason: str) -> None:
        """Refused before its hello: counted, logged (throttled), answered and closed;
        in its TLS handshake, cut."""
        self._server.refused(self._peer, reason)
        self._end(code, reason)

    def _end(self, code: str, reason: str) -> None:
        transport = self._transport
        if transport is None:
            self._drop(None if self._server.tls else _error(code, reason))
        elif not transport.is_closing():
            transport.write(_error(code, reason))
            transport.close()

    def _drop(self, answer: bytes | None) -> None:
        """Cut before connection_made. A task cancelled before it started never runs
        (its except and finally neither): a socket the loop has not taken over yet is
        closed here, after `answer` if it takes it at once; one in its TLS handshake is
        closed by the task's cancellation."""
        task, self._opening = self._opening, None
        if task is not None:
            task.cancel()
        sock, self._sock = self._sock, None
        if sock is not None:
            _turn_away(sock, answer)
        self._gone()

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except PayloadTooLarge as exc:
            if self._open:
                self._server.counts.bad += 1
                self._end("RESOURCE_EXHAUSTED", str(exc))
            else:
                self.refuse("UNAUTHENTICATED", f"no hello first ({exc})")
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
            self.refuse("UNAUTHENTICATED", "no valid ticket (ask the gRPC Link method)")
            return False
        server = self._server
        self._open = True
        server.greeted(self)
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
        self._gone()
        self._transport = None

    def _gone(self) -> None:
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        self._server.removed(self, self._open)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        else:
            self._drop(None)
