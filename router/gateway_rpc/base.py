"""The seams of the gateway client stack: `ManyGatewayClient`, one call of many batches
(what every layer below the coalescer implements: a single batch is a call of one), and
`GatewayClient`, one delivery per batch, with `EachGatewayClient.deliver_each`, many
batches each delivered on its own (what the coalescer offers, and P2P calls)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from shared.errors import GatewayUnavailable
from shared.proto import gateway_pb2

__all__ = [
    "Batches",
    "DeliverEach",
    "EachGatewayClient",
    "EachReplies",
    "GatewayClient",
    "ManyGatewayClient",
    "Replies",
    "deliver_each_of",
    "gather_each",
]

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


@runtime_checkable
class EachGatewayClient(Protocol):
    async def deliver_each(
        self, gateway_id: str, address: str, batches: Batches, timeout_s: float
    ) -> EachReplies:
        """Every batch delivered as its own delivery (in as few calls as the client
        makes of them); each one's reply or error, in order."""
        ...


# `EachGatewayClient.deliver_each`, of whichever client.
DeliverEach = Callable[[str, str, Batches, float], Awaitable[EachReplies]]


def deliver_each_of(client: GatewayClient) -> DeliverEach:
    """`EachGatewayClient.deliver_each` of any client: its own, or (a plain one) one call
    per batch. Resolved once, when a caller is built: a runtime protocol check costs too
    much to make per push."""
    if isinstance(client, EachGatewayClient):
        return client.deliver_each

    async def one_call_each(
        gateway_id: str, address: str, batches: Batches, timeout_s: float
    ) -> EachReplies:
        return await gather_each(
            [client.deliver(gateway_id, address, b, timeout_s) for b in batches]
        )

    return one_call_each


async def gather_each(
    deliveries: Sequence[Awaitable[gateway_pb2.DeliverReply]],
) -> EachReplies:
    """Each delivery's reply, or the GatewayUnavailable it failed with (in order); any
    other error is raised."""
    if len(deliveries) == 1:  # the usual P2P push: awaited here, no gather and no task
        try:
            return [await deliveries[0]]
        except GatewayUnavailable as exc:
            return [exc]
    replies: EachReplies = []
    for r in await asyncio.gather(*deliveries, return_exceptions=True):
        if isinstance(r, BaseException) and not isinstance(r, GatewayUnavailable):
            raise r
        replies.append(r)
    return replies
