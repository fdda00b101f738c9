"""The gateway's gRPC service, `imroute.v1.Gateway` (shared/proto/gateway.proto).

Registered through `add_GatewayServicer_to_server` (shared.proto.gateway_service, whose
method table a test holds to the .proto), so no method name or codec is spelled here; a
DeliverMany goes to the delivery core, as a call on the delivery link does
(socket_gateway.link_server).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from shared.internal_auth import TlsFiles
from shared.proto import gateway_pb2, gateway_service
from socket_gateway.delivery import BadCall, DeliverService

if TYPE_CHECKING:
    from grpc.aio import ServicerContext

__all__ = ["GatewayServicer", "start_grpc_server"]

# As much as the router's channels send (router/gateway_rpc/client.py).
MAX_RECEIVE_BYTES = 16 << 20


class GatewayServicer(gateway_service.GatewayServicer):
    """DeliverMany(batches), `DeliverService.deliver_call` over gRPC; Link tells where
    the delivery link is (`offer`: a new LinkReply each time, with a fresh ticket; None:
    port 0, no link)."""

    def __init__(
        self,
        service: DeliverService,
        offer: Callable[[], gateway_pb2.LinkReply] | None = None,
    ) -> None:
        self._service = service
        self.offer = offer

    async def DeliverMany(
        self,
        request: gateway_pb2.DeliverManyRequest,
        context: ServicerContext[gateway_pb2.DeliverManyRequest, gateway_pb2.DeliverManyReply],
    ) -> gateway_pb2.DeliverManyReply:
        service = self._service
        traceparent = _traceparent(context) if service.tracing is not None else ""
        try:
            replies = service.deliver_call(request.batches, context.time_remaining(), traceparent)
        except BadCall as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.problem)
        return gateway_pb2.DeliverManyReply(replies=replies)

    async def Link(
        self,
        request: gateway_pb2.LinkRequest,
        context: ServicerContext[gateway_pb2.LinkRequest, gateway_pb2.LinkReply],
    ) -> gateway_pb2.LinkReply:
        return gateway_pb2.LinkReply() if self.offer is None else self.offer()


def _traceparent(context: ServicerContext[Any, Any]) -> str:
    """The call's `traceparent` metadata (gRPC tooling's way), for its batches that carry
    none of their own (the router's way: one call may carry many pushes' batches)."""
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent" and isinstance(value, str):
            return value
    return ""


async def start_grpc_server(
    servicer: GatewayServicer,
    host: str,
    port: int,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    tls: TlsFiles | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Start a grpc.aio server; returns it and the bound port (port 0 picks one). With
    `tls`, the port is mTLS only: a caller without a cert the CA signed gets no call."""
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
            ("grpc.so_reuseport", 0),
        ],
    )
    gateway_service.add_GatewayServicer_to_server(servicer, server)
    # "": every interface, as for the event loop's servers (gRPC refuses an empty host)
    address = f"{host or '[::]'}:{port}"
    try:
        if tls is None:
            bound = server.add_insecure_port(address)
        else:
            credentials = grpc.ssl_server_credentials(
                [(tls.key, tls.cert)], root_certificates=tls.ca, require_client_auth=True
            )
            bound = server.add_secure_port(address, credentials)
    except RuntimeError:  # grpcio's "Failed to bind to address" (older ones return 0)
        bound = 0
    if bound == 0:
        raise OSError(
            f"gRPC on {address} (IMROUTE_GRPC_HOST, IMROUTE_GRPC_PORT): the port is taken, "
            "or the host is no address of this machine"
        )
    await server.start()
    return server, bound
