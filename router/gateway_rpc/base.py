"""The seam every layer of the gateway client stack implements (and P2P calls)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from shared.proto import gateway_pb2

__all__ = ["Batches", "GatewayClient", "ManyGatewayClient", "Replies"]

# What one DeliverMany carries and answers, in order.
Batches = Sequence[gateway_pb2.Batch]
Replies = list[gateway_pb2.DeliverReply]


class GatewayClient(Protocol):
    async def deliver(
        self, gateway_id: str, address: str, batch: gateway_pb2.Batch, timeout_s: float
    ) -> gateway_pb2.DeliverReply: ...

    def retain(self, live: Mapping[str, str]) -> None:
        """Forget what is kept for gateways not in `live` (gateway id -> address)."""

    async def close(self) -> None: ...


class ManyGatewayClient(GatewayClient, Protocol):
    async def deliver_many(
        self, gateway_id: str, address: str, batches: Batches, timeout_s: float
    ) -> Replies: ...
