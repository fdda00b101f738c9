"""The gRPC glue of the gateway's service, `imroute.v1.Gateway` (gateway.proto), written by
hand over grpc's public API; the messages stay generated (gateway_pb2, ./scripts/proto).

METHODS is the one table of the service's RPCs (name, request and reply message): the
client stubs and the server registration use it, and a test holds it to the .proto's
service descriptor, so an RPC added to the .proto without its glue fails that test.

- `GatewayStub(channel)`: the client; a `GatewayAsyncStub` for a grpc.aio channel, a
  `GatewaySyncStub` for a grpc one.
- `GatewayServicer`: the base of a server's implementation (async or sync methods).
- `add_GatewayServicer_to_server(servicer, server)`: registers it on a grpc or grpc.aio
  server.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Generic, NoReturn, TypeAlias, TypeVar, overload

import grpc
import grpc.aio
from google.protobuf.message import Message

from shared.proto.gateway_pb2 import (
    DeliverManyReply,
    DeliverManyRequest,
    LinkReply,
    LinkRequest,
)

__all__ = [
    "DELIVER_MANY",
    "LINK",
    "METHODS",
    "SERVICE",
    "GatewayAsyncStub",
    "GatewayServicer",
    "GatewayStub",
    "GatewaySyncStub",
    "Rpc",
    "add_GatewayServicer_to_server",
]

_Req = TypeVar("_Req", bound=Message)
_Rep = TypeVar("_Rep", bound=Message)

# A grpc.ServicerContext (grpc server) or a grpc.aio.ServicerContext[Req, Rep] (grpc.aio
# server). No type is both (their methods differ: abort is a coroutine in grpc.aio), so
# the base's methods take either, and an implementation names the one it gets.
_ServicerContext: TypeAlias = Any

SERVICE = "imroute.v1.Gateway"


@dataclass(frozen=True, slots=True)
class Rpc(Generic[_Req, _Rep]):
    """One unary RPC of the service: its name in the .proto and its messages."""

    name: str
    request: type[_Req]
    reply: type[_Rep]

    @property
    def path(self) -> str:
        """The full method name on the wire, `/imroute.v1.Gateway/<name>`."""
        return f"/{SERVICE}/{self.name}"


DELIVER_MANY = Rpc("DeliverMany", DeliverManyRequest, DeliverManyReply)
LINK = Rpc("Link", LinkRequest, LinkReply)
METHODS: tuple[Rpc[Any, Any], ...] = (DELIVER_MANY, LINK)


@overload
def _unary(
    channel: grpc.aio.Channel, rpc: Rpc[_Req, _Rep]
) -> grpc.aio.UnaryUnaryMultiCallable[_Req, _Rep]: ...
@overload
def _unary(
    channel: grpc.Channel, rpc: Rpc[_Req, _Rep]
) -> grpc.UnaryUnaryMultiCallable[_Req, _Rep]: ...
def _unary(
    channel: grpc.Channel | grpc.aio.Channel, rpc: Rpc[_Req, _Rep]
) -> grpc.UnaryUnaryMultiCallable[_Req, _Rep] | grpc.aio.UnaryUnaryMultiCallable[_Req, _Rep]:
    return channel.unary_unary(
        rpc.path,
        request_serializer=rpc.request.SerializeToString,
        response_deserializer=rpc.reply.FromString,
    )


class GatewayStub:
    """The client: `GatewayStub(channel)` is a GatewayAsyncStub for a grpc.aio.Channel, a
    GatewaySyncStub for a grpc.Channel (each has a callable per RPC)."""

    __slots__ = ()

    @overload
    def __new__(cls, channel: grpc.aio.Channel) -> GatewayAsyncStub: ...
    @overload
    def __new__(cls, channel: grpc.Channel) -> GatewaySyncStub: ...
    def __new__(cls, channel: grpc.Channel | grpc.aio.Channel) -> GatewayStub:
        flavour = cls
        if cls is GatewayStub:
            async_ = isinstance(channel, grpc.aio.Channel)
            flavour = GatewayAsyncStub if async_ else GatewaySyncStub
        return object.__new__(flavour)


class GatewayAsyncStub(GatewayStub):
    """The client on a grpc.aio channel: `await stub.DeliverMany(request, timeout=...)`."""

    __slots__ = ("DeliverMany", "Link")

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.DeliverMany = _unary(channel, DELIVER_MANY)
        self.Link = _unary(channel, LINK)


class GatewaySyncStub(GatewayStub):
    """The client on a (blocking) grpc channel: `stub.DeliverMany(request, timeout=...)`."""

    __slots__ = ("DeliverMany", "Link")

    def __init__(self, channel: grpc.Channel) -> None:
        self.DeliverMany = _unary(channel, DELIVER_MANY)
        self.Link = _unary(channel, LINK)


class GatewayServicer:
    """The server's implementation of the service: subclass it and override each RPC, with
    an `async def` on a grpc.aio server (or a plain def on a grpc one). One left as it is
    answers UNIMPLEMENTED."""

    def DeliverMany(
        self, request: DeliverManyRequest, context: _ServicerContext
    ) -> DeliverManyReply | Awaitable[DeliverManyReply]:
        """The delivery call while no link is open (and where the gateway offers none)."""
        _unimplemented(context)

    def Link(
        self, request: LinkRequest, context: _ServicerContext
    ) -> LinkReply | Awaitable[LinkReply]:
        """Where and how to open the delivery link (a gateway without one answers port 0)."""
        _unimplemented(context)


def _unimplemented(context: _ServicerContext) -> NoReturn:
    context.set_code(grpc.StatusCode.UNIMPLEMENTED)
    context.set_details("Method not implemented!")
    raise NotImplementedError("Method not implemented!")


def add_GatewayServicer_to_server(
    servicer: GatewayServicer, server: grpc.Server | grpc.aio.Server
) -> None:
    """Serve `servicer`'s methods on `server` (before it starts), one per METHODS row."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        rpc.name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, rpc.name),
            request_deserializer=rpc.request.FromString,
            response_serializer=rpc.reply.SerializeToString,
        )
        for rpc in METHODS
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    # Newer grpcio (both servers in 1.85) looks these up first, without the generic
    # handlers' per-call search; a server without it (an older one, a fake) has the latter.
    if hasattr(server, "add_registered_method_handlers"):
        server.add_registered_method_handlers(SERVICE, handlers)
