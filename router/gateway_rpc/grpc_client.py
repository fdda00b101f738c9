"""The router's client of the gateways' delivery calls: per gateway, its carriers, and
one carrier per call.

A call goes on the gateway's delivery link (router.gateway_rpc.link: about a tenth of
gRPC's CPU per call) when one is open, else in a unary DeliverMany on the one grpc.aio
channel kept per gateway address (which also carries the control call `Link`). A
single batch is a call of one. Errors of either carrier become GatewayUnavailable
here, named by gRPC status code; router.gateway_rpc.resilient retries them.

Per gateway address, the link is: open; or being opened by a task (ask the gateway's
gRPC `Link` method for its port and a ticket, connect, hello); or waiting for the time
to try again (a link that could not be opened, or broke, is tried again RETRY_S later,
and after each failure to open one twice as late, up to RETRY_MAX_S); or nothing to
try: a gateway that offers no link (port 0). Until a link is open, calls go in gRPC
DeliverMany calls: nothing waits for a link.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from router.gateway_rpc.base import Batches, GatewayClient, ManyGatewayClient, Replies
from router.gateway_rpc.link import DeliveryLink, open_link
from shared.backoff import backoff_s
from shared.errors import GatewayUnavailable
from shared.internal_auth import TlsFiles, token_metadata
from shared.proto import gateway_pb2
from shared.proto.gateway_service import GatewayAsyncStub, GatewayStub
from shared.tasks import Background
from shared.tls_context import client_context

__all__ = [
    "CLOSE_GRACE_S",
    "OPEN_TIMEOUT_S",
    "RETRY_MAX_S",
    "RETRY_S",
    "GatewayClient",
    "GrpcGatewayClients",
    "ManyGatewayClient",
    "host_of",
    "retry_in",
]

log = logging.getLogger(__name__)

# A channel to a gateway that left the fleet is closed; calls still on it get this long.
CLOSE_GRACE_S = 5.0
# How long the gRPC `Link` call (where is the delivery link?) may take.
LINK_ASK_S = 2.0
# Opening a delivery link (connect, TLS, hello) may take this long.
OPEN_TIMEOUT_S = 2.0
# A link that broke or could not be opened is tried again this long after, doubling with
# each failure to open in a row, up to RETRY_MAX_S.
RETRY_S = 5.0
RETRY_MAX_S = 60.0

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


def retry_in(failures: int) -> float:
    """How long after its `failures`-th failure in a row a link is tried again."""
    return backoff_s(failures, RETRY_S, RETRY_MAX_S, rand=None)


def host_of(address: str) -> str:
    """The host of a gRPC address: `10.0.0.5:9101` -> `10.0.0.5`, `[::1]:9101` -> `::1`."""
    host = address.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


@dataclass(frozen=True, slots=True)
class _Stub:
    channel: grpc.aio.Channel
    rpc: GatewayAsyncStub  # method paths and codecs: shared.proto.gateway_service


class GrpcGatewayClients:
    """Per gateway address: one grpc.aio channel, and a delivery link while one is open;
    errors become GatewayUnavailable."""

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
        self._closing = Background("closing a channel or a link", log)
        self._metadata = token_metadata(token) if token is not None else None
        self._credentials: grpc.ChannelCredentials | None = None
        self._options = list(_CHANNEL_OPTIONS)
        if tls is not None:
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
            )
            if tls.server_name:
                self._options.append(("grpc.ssl_target_name_override", tls.server_name))
        # The delivery links, by gateway address.
        self._links = links
        self._link_tls = None if tls is None or not links else client_context(tls)
        self._link_server_name = None if tls is None else tls.server_name
        self._open: dict[str, DeliveryLink] = {}
        self._opening: dict[str, asyncio.Task[None]] = {}  # those of _linking still asking
        self._linking = Background("opening a delivery link", log)
        self._retry_at: dict[str, float] = {}
        self._no_link: set[str] = set()  # addresses that offer no link
        self._failures: dict[str, int] = {}  # failed opens in a row, per address
        self.links_opened = 0

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
        link = self._link(gateway_id, address) if self._links else None
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

    # ------------------------------------------------------------------ the links

    def _link(self, gateway_id: str, address: str) -> DeliveryLink | None:
        """The open link to `address`, or None (then one is being opened, if it may)."""
        link = self._open.get(address)
        if link is not None:
            if link.usable and link.gateway_id == gateway_id:
                return link
            del self._open[address]
            self._end(link)
            if not link.usable:
                self._retry_at[address] = asyncio.get_running_loop().time() + RETRY_S
        if address in self._no_link or address in self._opening:
            return None
        now = asyncio.get_running_loop().time()
        if now < self._retry_at.get(address, 0.0):
            return None
        self._opening[address] = self._linking.spawn(
            self._open_link(gateway_id, address), f"link-open:{address}"
        )
        return None

    async def _open_link(self, gateway_id: str, address: str) -> None:
        try:
            reply = await self._ask_link(gateway_id, address)
            if reply.port == 0:
                self._no_link.add(address)
                log.info("gateway %s offers no delivery link: calls go over gRPC", gateway_id)
                return
            if reply.gateway_id and reply.gateway_id != gateway_id:
                raise GatewayUnavailable(gateway_id, f"{address} is now {reply.gateway_id}")
            link = await open_link(
                gateway_id,
                host_of(address),
                reply.port,
                reply.ticket,
                OPEN_TIMEOUT_S,
                self._link_tls,
                self._link_server_name,
            )
        except GatewayUnavailable as exc:
            failures = self._failures[address] = self._failures.get(address, 0) + 1
            wait = retry_in(failures)
            self._retry_at[address] = asyncio.get_running_loop().time() + wait
            if failures == 1 or wait >= RETRY_MAX_S:  # at most a line a minute, then
                log.warning(
                    "no delivery link to gateway %s yet (%d tries; calls go over gRPC; "
                    "again in %gs): %s",
                    gateway_id,
                    failures,
                    wait,
                    exc.reason,
                )
            return
        finally:
            if self._opening.get(address) is asyncio.current_task():
                del self._opening[address]
        self.links_opened += 1
        self._retry_at.pop(address, None)
        self._failures.pop(address, None)
        self._open[address] = link

    async def _ask_link(self, gateway_id: str, address: str) -> gateway_pb2.LinkReply:
        try:
            return await self._stub(address).rpc.Link(
                gateway_pb2.LinkRequest(), timeout=LINK_ASK_S, metadata=self._metadata
            )
        except (grpc.aio.AioRpcError, grpc.aio.BaseError, grpc.RpcError, ValueError) as exc:
            raise _translate(gateway_id, exc) from None

    def _end(self, link: DeliveryLink) -> None:
        self._later(link.ended(self._grace), "link-end")

    def _forget_link(self, address: str) -> None:
        """The gateway at `address` left or restarted: its link ends (calls on it get the
        grace), and whether it offers one is asked again."""
        link = self._open.pop(address, None)
        if link is not None:
            self._end(link)
        task = self._opening.pop(address, None)
        if task is not None:
            task.cancel()
            # It ends in `_linking`, which `close()` waits for.
        self._retry_at.pop(address, None)
        self._failures.pop(address, None)
        self._no_link.discard(address)

    def _link_addresses(self) -> set[str]:
        return {*self._open, *self._opening, *self._retry_at, *self._no_link, *self._failures}

    # ------------------------------------------------------------------ the fleet changes

    def retain(self, live: Mapping[str, str]) -> None:
        """Close the channels and links to addresses no live gateway has; calls still on
        them get `close_grace_s` to finish."""
        addresses = set(live.values())
        for address in self._link_addresses() - addresses:
            self._forget_link(address)
        for address in [a for a in self._stubs if a not in addresses]:
            self._close_later(address, self._stubs.pop(address).channel)

    def reconnect(self, address: str) -> None:
        """The gateway at `address` restarted: its next call goes on a new channel. The
        old one may sit in gRPC's reconnect backoff (up to 1 s of failing fast after the
        crash), which would fail the circuit's probe of a gateway that is back up. Calls
        still on the old channel get `close_grace_s` to finish."""
        stub = self._stubs.pop(address, None)
        self._forget_link(address)
        if stub is not None:
            self._close_later(address, stub.channel)

    def _close_later(self, address: str, channel: grpc.aio.Channel) -> None:
        self._later(channel.close(self._grace), f"close:{address}")

    def _later(self, closing: Coroutine[Any, Any, None], name: str) -> None:
        self._closing.spawn(closing, name)

    def __len__(self) -> int:
        return len(self._stubs)

    async def close(self) -> None:
        await self._linking.cancel()
        links = list(self._open.values())
        self._open.clear()
        for link in links:
            link.close()
        stubs = list(self._stubs.values())
        self._stubs.clear()
        for stub in stubs:
            await stub.channel.close()
        await self._closing.drain()  # with those a retain during the awaits above added


def _translate(gateway_id: str, exc: Exception) -> GatewayUnavailable:
    """Every grpc failure (and a bad address) as our error, naming the status code."""
    if isinstance(exc, grpc.aio.AioRpcError):
        code = exc.code().name
        return GatewayUnavailable(gateway_id, f"{code}: {exc.details()}", code)
    return GatewayUnavailable(gateway_id, f"{type(exc).__name__}: {exc}")
