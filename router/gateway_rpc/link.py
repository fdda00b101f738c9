"""The router's side of one delivery link to a gateway (docs/architecture/gateway-calls.md,
"The delivery link"; the gateway's side is socket_gateway.link_server).

The same calls as a gRPC DeliverMany, with the same outcomes, at a fraction of the CPU:
a call is one frame (a StreamCall with its own id and deadline) written straight to the
socket, and the replies are matched by id in the protocol's own callback. This is the
one call table of the router's carriers (pending futures, ids, deadlines, fail-all on
break); a DeliverMany over gRPC leaves all of that to gRPC.

- A caller waits at most its own deadline, then fails with DEADLINE_EXCEEDED; the link
  goes on (a late reply is dropped).
- When the link breaks (the gateway died or closed it), every call on it fails with
  UNAVAILABLE, which router.gateway_rpc.client retries (the gateway drops a batch id
  it already delivered), and the owner sends the next calls over gRPC while it opens
  another link.
- While more than MAX_BUFFERED bytes wait to be sent (a stopped gateway reads nothing),
  a call fails at once with RESOURCE_EXHAUSTED instead of queueing behind them.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import ssl
from typing import cast

from google.protobuf.message import DecodeError

from router.gateway_rpc.base import Batches, Replies
from shared.errors import GatewayUnavailable, PayloadTooLarge
from shared.link_frames import FrameReader, frame
from shared.proto import gateway_pb2

__all__ = ["MAX_BUFFERED", "DeliveryLink", "open_link"]

MAX_BUFFERED = 8 << 20
KEEPALIVE_IDLE_S = 30
KEEPALIVE_INTERVAL_S = 10
# As much as the gateways answer (socket_gateway.grpc_server.MAX_RECEIVE_BYTES).
FRAME_LIMIT = 16 << 20

_Reply = gateway_pb2.StreamReply


def _stream_call(call_id: int, batches: Batches, timeout_s: float) -> gateway_pb2.StreamCall:
    """One DeliverMany as a StreamCall, its deadline a duration in ms (as gRPC's)."""
    return gateway_pb2.StreamCall(
        call_id=call_id, batches=batches, timeout_ms=max(1, math.ceil(timeout_s * 1000))
    )


def _replies_of(gateway_id: str, reply: _Reply, batches: Batches) -> Replies:
    """A StreamReply's replies, one per batch in order; GatewayUnavailable when the
    gateway refused the call (its code) or answered another number of batches."""
    if reply.error_code:
        raise GatewayUnavailable(gateway_id, f"{reply.error_code}: {reply.error}", reply.error_code)
    if len(reply.replies) != len(batches):
        raise GatewayUnavailable(gateway_id, "the link answered the wrong number of batches")
    return list(reply.replies)


async def open_link(
    gateway_id: str,
    host: str,
    port: int,
    ticket: bytes,
    timeout_s: float,
    tls: ssl.SSLContext | None = None,
    server_name: str | None = None,
) -> DeliveryLink:
    """Connect, say hello with `ticket`, and wait for the welcome; GatewayUnavailable
    (naming why) when any of it fails or takes over `timeout_s`."""
    loop = asyncio.get_running_loop()
    transport: asyncio.BaseTransport | None = None
    try:
        async with asyncio.timeout(timeout_s):
            transport, link = await loop.create_connection(
                lambda: DeliveryLink(gateway_id),
                host,
                port,
                ssl=tls,
                server_hostname=(server_name or host) if tls is not None else None,
            )
            link.send(gateway_pb2.LinkHello(ticket=ticket).SerializeToString())
            welcome = await link.welcome
    except TimeoutError:
        if transport is not None:
            transport.close()
        raise GatewayUnavailable(
            gateway_id, f"DEADLINE_EXCEEDED: no link within {timeout_s:g}s", "DEADLINE_EXCEEDED"
        ) from None
    except (OSError, ssl.SSLError) as exc:
        if transport is not None:
            transport.close()
        raise GatewayUnavailable(
            gateway_id, f"UNAVAILABLE: link to {host}:{port}: {exc}", "UNAVAILABLE"
        ) from None
    except BaseException:  # cancelled while it waited for the welcome: no socket left open
        if transport is not None:
            transport.close()
        raise
    if welcome.error_code:
        link.close()
        raise GatewayUnavailable(
            gateway_id, f"{welcome.error_code}: {welcome.error}", welcome.error_code
        )
    return link


def _expire(future: asyncio.Future[_Reply]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


def _keepalive(sock: socket.socket | None) -> None:
    """TCP keepalive (as gRPC's 30 s pings): a gateway host that vanished without a reset
    is noticed in about a minute even while no call is on the link."""
    if sock is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)


class DeliveryLink(asyncio.Protocol):
    """One open link; `failed` is set (and stays) once it broke."""

    def __init__(self, gateway_id: str) -> None:
        self._gateway_id = gateway_id
        self._transport: asyncio.Transport | None = None
        self._reader = FrameReader(FRAME_LIMIT)
        self._pending: dict[int, asyncio.Future[_Reply]] = {}
        self._next_id = 0
        self.failed: GatewayUnavailable | None = None
        self.welcome: asyncio.Future[_Reply] = asyncio.get_running_loop().create_future()
        self._closed = asyncio.Event()

    @property
    def gateway_id(self) -> str:
        return self._gateway_id

    @property
    def usable(self) -> bool:
        return self.failed is None

    # ------------------------------------------------------------------ calls

    async def call(self, batches: Batches, timeout_s: float) -> Replies:
        """One DeliverMany on the link: the gateway's replies, in order."""
        transport = self._transport
        if self.failed is not None or transport is None:
            raise self.failed or self._broken("not connected")
        if transport.get_write_buffer_size() > MAX_BUFFERED:
            raise GatewayUnavailable(
                self._gateway_id,
                f"RESOURCE_EXHAUSTED: over {MAX_BUFFERED} bytes wait to be sent on the link",
                "RESOURCE_EXHAUSTED",
            )
        self._next_id += 1
        call_id = self._next_id
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Reply] = loop.create_future()
        self._pending[call_id] = future
        transport.write(frame(_stream_call(call_id, batches, timeout_s).SerializeToString()))
        # A timer on the future, not asyncio.timeout (which costs a task look-up and a
        # reschedule per call): at the deadline the future fails, the caller with it.
        timer = loop.call_later(timeout_s, _expire, future)
        try:
            reply = await future
        except TimeoutError:
            raise GatewayUnavailable(
                self._gateway_id,
                f"DEADLINE_EXCEEDED: no reply on the link within {timeout_s:.3f}s",
                "DEADLINE_EXCEEDED",
            ) from None
        finally:
            timer.cancel()
            self._pending.pop(call_id, None)
        return _replies_of(self._gateway_id, reply, batches)

    def send(self, payload: bytes) -> None:
        if self._transport is not None:
            self._transport.write(frame(payload))

    # ------------------------------------------------------------------ the protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)
        _keepalive(transport.get_extra_info("socket"))

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except PayloadTooLarge as exc:
            self._fail(self._broken(f"the gateway sent {exc}"))
            return
        pending = self._pending
        for payload in frames:
            try:
                reply = _Reply.FromString(payload)
            except DecodeError:
                self._fail(self._broken("sent a frame that is not a StreamReply"))
                return
            call_id = reply.call_id
            if call_id == 0:  # the welcome, or the gateway's reason for closing
                if not self.welcome.done():
                    self.welcome.set_result(reply)
                elif reply.error_code:
                    self._fail(self._broken(f"{reply.error_code}: {reply.error}"))
                continue
            future = pending.pop(call_id, None)
            if future is not None and not future.done():
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._fail(self._broken(f"closed ({exc})" if exc else "closed"))
        self._closed.set()

    def _broken(self, why: str) -> GatewayUnavailable:
        return GatewayUnavailable(self._gateway_id, f"UNAVAILABLE: link {why}", "UNAVAILABLE")

    def _fail(self, error: GatewayUnavailable) -> None:
        if self.failed is None:
            self.failed = error
        if not self.welcome.done():
            self.welcome.set_exception(OSError(error.reason))
        pending = list(self._pending.values())
        self._pending.clear()
        for future in pending:
            if not future.done():
                future.set_exception(error)
        if self._transport is not None:
            self._transport.close()

    # ------------------------------------------------------------------ the end

    def close(self) -> None:
        """Close now: calls still on the link fail with UNAVAILABLE."""
        self._fail(self._broken("closed by the router"))

    async def ended(self, grace_s: float) -> None:
        """Let the calls on the link have their answers (up to `grace_s`), then close."""
        if self._pending:
            await asyncio.wait(list(self._pending.values()), timeout=grace_s)
        self.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closed.wait(), timeout=1.0)
