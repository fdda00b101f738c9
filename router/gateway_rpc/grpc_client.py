"""gRPC client of the gateways' delivery calls, with one channel per gateway address.

Calls go on the gateway's delivery link when it has one open (router.gateway_rpc.links:
about a tenth of gRPC's CPU per call), else on one long-lived DeliverStream per channel
(router.gateway_rpc.grpc_stream), which costs gRPC about half what a unary call does.
A gateway that has no DeliverStream
(an older version, mid rolling upgrade) answers UNIMPLEMENTED once; from then on its
address gets unary Deliver/DeliverMany calls, and the calls that found out are resent
as such (nothing of them was delivered).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
import grpc.aio

from router.gateway_rpc.base import Batches, GatewayClient, ManyGatewayClient, Replies
from router.gateway_rpc.grpc_stream import DeliverStream
from router.gateway_rpc.link import DeliveryLink
from router.gateway_rpc.links import Links
from shared.errors import GatewayUnavailable
from shared.internal_auth import TlsFiles, token_metadata
from shared.proto import gateway_pb2
from shared.proto.gateway_pb2_grpc import GatewayStub
from shared.tls_context import client_context

if TYPE_CHECKING:
    # Only in the .pyi: what GatewayStub(channel) is for a grpc.aio channel.
    from shared.proto.gateway_pb2_grpc import GatewayAsyncStub

__all__ = [
    "CLOSE_GRACE_S",
    "GatewayClient",
    "GrpcGatewayClients",
    "ManyGatewayClient",
]

log = logging.getLogger(__name__)

# A channel to a gateway that left the fleet is closed; calls still on it get this long.
CLOSE_GRACE_S = 5.0
# How long the gRPC `Link` call (where is the delivery link?) may take.
LINK_ASK_S = 2.0

_CHANNEL_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.keepalive_time_ms", 30_000),
    # gRPC's own reconnect backoff grows to 120 s by default: a gateway that restarts
    # at the same address would stay unreachable long after the circuit breaker (which
    # does the backing off here) lets a probe through. Cap it at 1 s.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    # Each channel its own subchannels: gRPC otherwise shares them process-wide between
    # channels with equal arguments, so the new channel `reconnect` makes for a restarted
    # gateway would inherit the old one's subchannel, still backing off from the crash.
    # One channel per address is kept anyway, so nothing is lost by not sharing.
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_send_message_length", 16 << 20),
    ("grpc.max_receive_message_length", 16 << 20),
]


@dataclass(frozen=True, slots=True)
class _Stub:
    channel: grpc.aio.Channel
    rpc: GatewayAsyncStub  # the generated stub: method paths and codecs come from the .proto


class GrpcGatewayClients:
    """Keeps one grpc.aio channel per gateway address; errors become GatewayUnavailable."""

    def __init__(
        self,
        close_grace_s: float = CLOSE_GRACE_S,
        token: str | None = None,
        tls: TlsFiles | None = None,
        streams: bool = True,
        links: bool | None = None,
    ) -> None:
        """`token`: the gateways' IMROUTE_INTERNAL_TOKEN, sent with every call; `tls`:
        dial them with mTLS (this side's cert as the client's); `streams`: calls go on a
        DeliverStream per gateway (False: every call is a unary one); `links`: on the
        delivery links the gateways offer (by default, as `streams`)."""
        self._stubs: dict[str, _Stub] = {}
        self._streams: dict[str, DeliverStream] = {}
        self._unary_only: set[str] = set()
        self._use_streams = streams
        self.streams_opened = 0
        self._grace = close_grace_s
        self._closing: set[asyncio.Task[None]] = set()
        self._metadata = token_metadata(token) if token is not None else None
        self._credentials: grpc.ChannelCredentials | None = None
        self._options = list(_CHANNEL_OPTIONS)
        if tls is not None:
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
            )
            if tls.server_name:
                self._options.append(("grpc.ssl_target_name_override", tls.server_name))
        use_links = streams if links is None else links
        self._links: Links | None = None
        if use_links:
            context = None if tls is None else client_context(tls)
            server_name = None if tls is None else tls.server_name
            self._links = Links(self._ask_link, context, server_name, close_grace_s)

    @property
    def links_opened(self) -> int:
        return 0 if self._links is None else self._links.opened

    async def _ask_link(self, gateway_id: str, address: str) -> gateway_pb2.LinkReply:
        try:
            return await self._stub(address).rpc.Link(
                gateway_pb2.LinkRequest(), timeout=LINK_ASK_S, metadata=self._metadata
            )
        except (grpc.aio.AioRpcError, grpc.aio.BaseError, grpc.RpcError, ValueError) as exc:
            raise _translate(gateway_id, exc) from None

    def _stub(self, address: str) -> _Stub:
        stub = self._stubs.get(address)
        if stub is None:
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(address, options=self._options)
            else:
                channel = grpc.aio.secure_channel(address, self._credentials, self._options)
            stub = self._stubs[address] = _Stub(channel, GatewayStub(channel))
        return stub

    def _link(self, gateway_id: str, address: str) -> DeliveryLink | None:
        """The open link to `address`, or None. The stream it replaces takes no more
        calls, and ends once it has answered those it took. (Calls started together
        may then be answered out of order, as calls to two push-service workers are:
        a push awaited before the next is sent always arrives first.)"""
        link = None if self._links is None else self._links.get(gateway_id, address)
        if link is not None and self._streams:
            stream = self._streams.pop(address, None)
            if stream is not None:
                self._end_stream(stream)
        return link

    def _stream(self, gateway_id: str, address: str) -> DeliverStream | None:
        """The open stream to `address` (a new one if it broke), or None: unary calls."""
        if not self._use_streams or address in self._unary_only:
            return None
        stream = self._streams.get(address)
        if stream is not None and stream.usable and stream.gateway_id == gateway_id:
            return stream
        if stream is not None:
            self._end_stream(stream)
        stream = self._streams[address] = DeliverStream(
            self._stub(address).rpc, gateway_id, self._metadata, _translate
        )
        self.streams_opened += 1
        return stream

    async def deliver(
        self, gateway_id: str, address: str, batch: gateway_pb2.Batch, timeout_s: float
    ) -> gateway_pb2.DeliverReply:
        link = self._link(gateway_id, address)
        if link is not None:
            return (await link.call([batch], timeout_s))[0]
        stream = self._stream(gateway_id, address)
        if stream is not None:
            replies = await self._on_stream(stream, address, [batch], timeout_s)
            if replies is not None:
                return replies[0]
        metadata = self._metadata
        if batch.traceparent:  # also where gRPC tooling looks (the gateway reads either)
            metadata = (*(metadata or ()), ("traceparent", batch.traceparent))
        try:
            return await self._stub(address).rpc.Deliver(
                batch, timeout=timeout_s, metadata=metadata
            )
        except (grpc.aio.AioRpcError, grpc.aio.BaseError, grpc.RpcError, ValueError) as exc:
            raise _translate(gateway_id, exc) from None

    async def deliver_many(
        self, gateway_id: str, address: str, batches: Batches, timeout_s: float
    ) -> Replies:
        link = self._link(gateway_id, address)
        if link is not None:
            return await link.call(batches, timeout_s)
        stream = self._stream(gateway_id, address)
        if stream is not None:
            replies = await self._on_stream(stream, address, batches, timeout_s)
            if replies is not None:
                return replies
        request = gateway_pb2.DeliverManyRequest(batches=batches)
        try:
            reply = await self._stub(address).rpc.DeliverMany(
                request, timeout=timeout_s, metadata=self._metadata
            )
        except (grpc.aio.AioRpcError, grpc.aio.BaseError, grpc.RpcError, ValueError) as exc:
            raise _translate(gateway_id, exc) from None
        if len(reply.replies) != len(batches):
            raise GatewayUnavailable(gateway_id, "DeliverMany answered the wrong number of batches")
        return list(reply.replies)

    async def _on_stream(
        self, stream: DeliverStream, address: str, batches: Batches, timeout_s: float
    ) -> Replies | None:
        """The call on the stream; None when the gateway has no DeliverStream (then
        nothing was delivered, and the caller sends it unary)."""
        try:
            return await stream.call(batches, timeout_s)
        except GatewayUnavailable as exc:
            if exc.code != "UNIMPLEMENTED":
                raise
        if address not in self._unary_only:
            self._unary_only.add(address)
            log.info("gateway %s has no DeliverStream: unary calls to it", stream.gateway_id)
        return None

    def retain(self, live: Mapping[str, str]) -> None:
        """Close the channels to addresses no live gateway has; calls still on them get
        `close_grace_s` to finish."""
        addresses = set(live.values())
        if self._links is not None:
            self._links.retain(addresses)
        for address in [a for a in self._stubs if a not in addresses]:
            self._close_later(address, self._stubs.pop(address).channel)
        self._unary_only &= addresses

    def reconnect(self, address: str) -> None:
        """The gateway at `address` restarted: its next call goes on a new channel. The
        old one may sit in gRPC's reconnect backoff (up to 1 s of failing fast after the
        crash), which would fail the circuit's probe of a gateway that is back up. Calls
        still on the old channel get `close_grace_s` to finish."""
        stub = self._stubs.pop(address, None)
        self._unary_only.discard(address)  # it may have been upgraded
        if self._links is not None:
            self._links.forget(address)
        if stub is not None:
            self._close_later(address, stub.channel)

    def _end_stream(self, stream: DeliverStream) -> None:
        """Let a stream answer what it carries, then end; closing its channel ends it."""
        stream.finish()
        task = asyncio.create_task(stream.ended(self._grace), name="stream-end")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _close_later(self, address: str, channel: grpc.aio.Channel) -> None:
        stream = self._streams.pop(address, None)
        if stream is not None:
            stream.finish()  # answered within the grace, or cancelled with the channel
        task = asyncio.create_task(channel.close(self._grace), name=f"close:{address}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def __len__(self) -> int:
        return len(self._stubs)

    async def close(self) -> None:
        if self._links is not None:
            await self._links.close()
        streams = list(self._streams.values())
        self._streams.clear()
        for stream in streams:
            await stream.close()
        stubs = list(self._stubs.values())
        self._stubs.clear()
        for stub in stubs:
            await stub.channel.close()
        while self._closing:  # a retain during the awaits above may add more
            await asyncio.gather(*list(self._closing), return_exceptions=True)


def _translate(gateway_id: str, exc: Exception) -> GatewayUnavailable:
    """Every grpc failure (and a bad address) as our error, naming the status code."""
    if isinstance(exc, grpc.aio.AioRpcError):
        code = exc.code().name
        return GatewayUnavailable(gateway_id, f"{code}: {exc.details()}", code)
    return GatewayUnavailable(gateway_id, f"{type(exc).__name__}: {exc}")
