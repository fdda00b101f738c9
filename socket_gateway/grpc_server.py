"""The gateway's gRPC service, `imroute.v1.Gateway` (shared/proto/gateway.proto).

Registered through the generated `add_GatewayServicer_to_server`, so the method names
and codecs come from the .proto; every call goes to the delivery core.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from shared.internal_auth import TlsFiles
from shared.proto import gateway_pb2, gateway_pb2_grpc
from socket_gateway.delivery import DeliverService

if TYPE_CHECKING:
    from grpc.aio import ServicerContext

__all__ = ["GatewayServicer", "start_grpc_server"]

# As much as the router's channels send (router/gateway_rpc/grpc_client.py).
MAX_RECEIVE_BYTES = 16 << 20


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    """DeliverMany(batches) on top of `DeliverService`, and `answer` for the same call
    on the delivery link; Link tells where the link is (`offer`: a new LinkReply each
    time, with a fresh ticket; None: port 0, no link)."""

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
        service.calls += 1
        problem = self._first_problem(request.batches)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        if service.tracing is not None:
            _take_traceparent(request.batches, context)
        left = context.time_remaining()
        return gateway_pb2.DeliverManyReply(
            replies=[service.deliver(b, checked=True, call_left_s=left) for b in request.batches]
        )

    def _first_problem(self, batches: Sequence[gateway_pb2.Batch]) -> str | None:
        """What is wrong with the first bad batch of a call, or None. All are checked
        before any is written: a call is refused whole, never half-sent."""
        for i, batch in enumerate(batches):
            problem = self._service.problem(batch)
            if problem is not None:
                return f"batch {i}: {problem}"
        return None

    async def Link(
        self,
        request: gateway_pb2.LinkRequest,
        context: ServicerContext[gateway_pb2.LinkRequest, gateway_pb2.LinkReply],
    ) -> gateway_pb2.LinkReply:
        return gateway_pb2.LinkReply() if self.offer is None else self.offer()

    def answer(self, call: gateway_pb2.StreamCall) -> gateway_pb2.StreamReply:
        """A StreamCall's reply, on the delivery link."""
        service = self._service
        service.calls += 1
        problem = self._first_problem(call.batches)
        if problem is not None:  # as DeliverMany's, but the link itself goes on
            return gateway_pb2.StreamReply(
                call_id=call.call_id,
                error_code=grpc.StatusCode.INVALID_ARGUMENT.name,
                error=problem,
            )
        # The deadline travels as a duration, like gRPC's: it starts when the call is read.
        left = call.timeout_ms / 1000 if call.timeout_ms else None
        return gateway_pb2.StreamReply(
            call_id=call.call_id,
            replies=[service.deliver(b, checked=True, call_left_s=left) for b in call.batches],
        )


def _take_traceparent(
    batches: Sequence[gateway_pb2.Batch], context: ServicerContext[Any, Any]
) -> None:
    """The call's `traceparent` metadata (gRPC tooling's way) for its batches that carry
    none of their own (the router's way: one call may carry many pushes' batches)."""
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent" and isinstance(value, str):
            for batch in batches:
                if not batch.traceparent:
                    batch.traceparent = value
            return


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
    gateway_pb2_grpc.add_GatewayServicer_to_server(servicer, server)
    # "": every interface, as for the event loop's servers (gRPC refuses an empty host)
    address = f"{host or '[::]'}:{port}"
    if tls is None:
        bound = server.add_insecure_port(address)
    else:
        credentials = grpc.ssl_server_credentials(
            [(tls.key, tls.cert)], root_certificates=tls.ca, require_client_auth=True
        )
        bound = server.add_secure_port(address, credentials)
    if bound == 0:
        raise OSError(f"could not bind gRPC on {address}")
    await server.start()
    return server, bound
