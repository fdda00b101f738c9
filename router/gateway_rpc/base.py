"""The two seams of the gateway client stack, each a batch API (a single batch is a
batch of one): `ManyGatewayClient.deliver_many`, one call of many batches (what every
layer below the coalescer implements), and `EachGatewayClient.deliver_each`, many
batches each delivered on its own (what the coalescer offers, and P2P calls)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from shared.errors import GatewayUnavailable
from shared.proto import gateway_pb2

__all__ = [
    "Batches",
    "EachGatewayClient",
    "EachReplies",
    "ManyGatewayClient",
    "Replies",
]

# What one DeliverMany carries and answers, in order.
Batches = Sequence[gateway_pb2.Batch]
Replies = list[gateway_pb2.DeliverReply]


class ManyGatewayClient(Protocol):
    async def deliver_many(
        self, gateway_id: str, address: str, batches: Batches, timeout_s: float
    ) -> Replies:
        """One call: the gateway's reply to each batch, in order."""
        ...

    def retain(self, live: Mapping[str, str]) -> None:
        """Forget what is kept for gateways not in `live` (gateway id -> address)."""

    async def close(self) -> None: ...


# Each batch's reply, or why that batch was not delivered.
EachReplies = list[gateway_pb2.DeliverReply | GatewayUnavailable]


class EachGatewayClient(Protocol):
    async def deliver_each(
        self, gateway_id: str, address: str, batches: Batches, timeout_s: float
    ) -> EachReplies:
        """Every batch delivered as its own delivery (in as few calls as the client
        makes of them); each one's reply or error, in order."""
        ...
