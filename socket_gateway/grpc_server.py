"""The gateway's gRPC service: Deliver(batch) writes one message to the listed local users."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import grpc.aio

from shared.clock import Clock
from shared.proto import gateway_pb2
from shared.wire import encode_push_json, message_of, ws_text_frame
from socket_gateway.connections import LocalConnections
from socket_gateway.dedup import RecentIds, RecentReplies

__all__ = ["DeliverService", "start_grpc_server"]


class DeliverService:
    """Writes batches to local connections; counts what happened for tests and metrics."""

    def __init__(self, conns: LocalConnections, clock: Clock, recent: RecentIds) -> None:
        self._conns = conns
        self._clock = clock
        self._recent = recent
        self._replies = RecentReplies(clock)
        self.calls = 0
        self.batches = 0
        self.duplicates = 0
        self.expired = 0

    def deliver(self, batch: gateway_pb2.Batch) -> gateway_pb2.DeliverReply:
        """Deliver one batch (from a gRPC call or the bus), at most once per batch_id."""
        self.batches += 1
        if batch.batch_id and batch.mode == gateway_pb2.MODE_P2P:
            first = self._replies.get(batch.batch_id, batch.uids)
            if first is not None:
                # A retried call whose first answer was lost: answer as the first attempt
                # did (even if the push has expired since: it was delivered in time).
                self.duplicates += 1
                return gateway_pb2.DeliverReply(
                    delivered=first[0], missing=first[1], duplicate=True
                )
        if batch.batch_id and self._recent.check_and_add(batch.batch_id):
            # Before the expiry check: a batch delivered in time is a duplicate, not late.
            self.duplicates += 1
            return gateway_pb2.DeliverReply(duplicate=True)
        if batch.expires_ms and self._clock.now_ms() > batch.expires_ms:
            # Never late: an expired message is dropped here and counted.
            self.expired += 1
            return gateway_pb2.DeliverReply(expired=True)
        # Encoded once per batch, whatever the number of recipients.
        frame = ws_text_frame(encode_push_json(message_of(batch)))
        if batch.everyone:
            return gateway_pb2.DeliverReply(connections=self._conns.deliver_all(frame))
        delivered, missing = self._conns.deliver(batch.uids, frame)
        if batch.mode == gateway_pb2.MODE_P2P and batch.batch_id:
            self._replies.put(batch.batch_id, batch.uids, delivered)
        return gateway_pb2.DeliverReply(delivered=delivered, missing=missing)

    async def _handle(
        self,
        batch: gateway_pb2.Batch,
        context: grpc.aio.ServicerContext[gateway_pb2.Batch, gateway_pb2.DeliverReply],
    ) -> gateway_pb2.DeliverReply:
        self.calls += 1
        return self.deliver(batch)

    async def _handle_many(
        self,
        request: gateway_pb2.DeliverManyRequest,
        context: grpc.aio.ServicerContext[
            gateway_pb2.DeliverManyRequest, gateway_pb2.DeliverManyReply
        ],
    ) -> gateway_pb2.DeliverManyReply:
        self.calls += 1
        return gateway_pb2.DeliverManyReply(replies=[self.deliver(b) for b in request.batches])

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            "imroute.v1.Gateway",
            {
                "Deliver": grpc.unary_unary_rpc_method_handler(
                    self._handle,
                    request_deserializer=gateway_pb2.Batch.FromString,
                    response_serializer=gateway_pb2.DeliverReply.SerializeToString,
                ),
                "DeliverMany": grpc.unary_unary_rpc_method_handler(
                    self._handle_many,
                    request_deserializer=gateway_pb2.DeliverManyRequest.FromString,
                    response_serializer=gateway_pb2.DeliverManyReply.SerializeToString,
                ),
            },
        )


async def start_grpc_server(
    service: DeliverService,
    host: str,
    port: int,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
) -> tuple[grpc.aio.Server, int]:
    """Start a grpc.aio server; returns it and the bound port (port 0 picks one)."""
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", 16 << 20),
            ("grpc.so_reuseport", 0),
        ]
    )
    server.add_generic_rpc_handlers((service.handler(),))
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"could not bind gRPC on {host}:{port}")
    await server.start()
    return server, bound
