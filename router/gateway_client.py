"""gRPC client of the gateways' Deliver call, with one channel per gateway address."""

from __future__ import annotations

from typing import Protocol

import grpc
import grpc.aio

from shared.errors import GatewayUnavailable
from shared.proto import gateway_pb2

__all__ = ["DELIVER_METHOD", "GatewayClient", "GrpcGatewayClients"]

DELIVER_METHOD = "/imroute.v1.Gateway/Deliver"

_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.max_send_message_length", 16 << 20),
    ("grpc.max_receive_message_length", 16 << 20),
]


class GatewayClient(Protocol):
    async def deliver(
        self, gateway_id: str, address: str, batch: gateway_pb2.Batch, timeout_s: float
    ) -> gateway_pb2.DeliverReply: ...

    async def close(self) -> None: ...


class GrpcGatewayClients:
    """Keeps one grpc.aio channel per gateway address; errors become GatewayUnavailable."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._calls: dict[
            str, grpc.aio.UnaryUnaryMultiCallable[gateway_pb2.Batch, gateway_pb2.DeliverReply]
        ] = {}

    def _call(
        self, address: str
    ) -> grpc.aio.UnaryUnaryMultiCallable[gateway_pb2.Batch, gateway_pb2.DeliverReply]:
        call = self._calls.get(address)
        if call is None:
            channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
            self._channels[address] = channel
            call = channel.unary_unary(
                DELIVER_METHOD,
                request_serializer=gateway_pb2.Batch.SerializeToString,
                response_deserializer=gateway_pb2.DeliverReply.FromString,
            )
            self._calls[address] = call
        return call

    async def deliver(
        self, gateway_id: str, address: str, batch: gateway_pb2.Batch, timeout_s: float
    ) -> gateway_pb2.DeliverReply:
        try:
            return await self._call(address)(batch, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise GatewayUnavailable(gateway_id, f"{exc.code().name}: {exc.details()}") from None

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        self._calls.clear()
        for channel in channels:
            await channel.close()
