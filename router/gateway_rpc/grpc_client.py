"""The router's client of the gateways' delivery calls: one carrier per call.

A call goes on the gateway's delivery link when one is open (router.gateway_rpc.links:
about a tenth of gRPC's CPU per call), else in a unary DeliverMany on the one grpc.aio
channel kept per gateway address (which also carries the control call `Link`). A
single batch is a call of one. Errors of either carrier become GatewayUnavailable
here, named by gRPC status code; router.gateway_rpc.resilient retries them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
import grpc.aio

from router.gateway_rpc.base import Batches, GatewayClient, ManyGatewayClient, Replies
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
        links: bool = True,
    ) -> None:
        """`token`: the gateways' IMROUTE_INTERNAL_TOKEN, sent with every call; `tls`:
        dial them with mTLS (this side's cert as the client's); `links`: use the
        delivery links the gateways offer (False: every call is a DeliverMany)."""
        self._stubs: dict[str, _Stub] = {}
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
        self._links: Links | None = None
        if links:
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

    async def deliver(
        self, gateway_id: str, address: str, batch: gateway_pb2.Batch, timeout_s: float
    ) -> gateway_pb2.DeliverReply:
        """One batch: a call of one."""
        return (await self.deliver_many(gateway_id, address, [batch], timeout_s))[0]

    async def deliver_many(
        self, gateway_id: str, address: str, batches: Batches, timeout_s: float
    ) -> Replies:
        """One call: on the open link, else a DeliverMany. (Calls started together while
        a link opens may be answered out of order, as calls to two push-service workers
        are: a push awaited before the next is sent always arrives first.)"""
        link = None if self._links is None else self._links.get(gateway_id, address)
        if link is not None:
            return await link.call(batches, timeout_s)
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

    def retain(self, live: Mapping[str, str]) -> None:
        """Close the channels and links to addresses no live gateway has; calls still on
        them get `close_grace_s` to finish."""
        addresses = set(live.values())
        if self._links is not None:
            self._links.retain(addresses)
        for address in [a for a in self._stubs if a not in addresses]:
            self._close_later(address, self._stubs.pop(address).channel)

    def reconnect(self, address: str) -> None:
        """The gateway at `address` restarted: its next call goes on a new channel. The
        old one may sit in gRPC's reconnect backoff (up to 1 s of failing fast after the
        crash), which would fail the circuit's probe of a gateway that is back up. Calls
        still on the old channel get `close_grace_s` to finish."""
        stub = self._stubs.pop(address, None)
        if self._links is not None:
            self._links.forget(address)
        if stub is not None:
            self._close_later(address, stub.channel)

    def _close_later(self, address: str, channel: grpc.aio.Channel) -> None:
        task = asyncio.create_task(channel.close(self._grace), name=f"close:{address}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def __len__(self) -> int:
        return len(self._stubs)

    async def close(self) -> None:
        if self._links is not None:
            await self._links.close()
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
