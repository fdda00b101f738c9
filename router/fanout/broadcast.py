"""Broadcast: one batch per directory page, published once to every gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from router.fanout.publisher import BROADCAST_TOPIC, BatchPublisher
from shared.proto import gateway_pb2

__all__ = ["run_broadcast"]


async def run_broadcast(
    pages: AsyncIterator[Sequence[str]] | None, publisher: BatchPublisher
) -> None:
    """Publish each page of uids as one batch; `pages` None means everyone online.

    Every gateway receives every batch and delivers to the listed uids it holds, so a
    page costs one publish however many gateways there are. "Everyone online" reads no
    directory: one batch tells each gateway to write to all its local connections.
    """
    if pages is None:
        await publisher.publish(gateway_pb2.MODE_BROADCAST, BROADCAST_TOPIC, everyone=True)
        return
    async for page in pages:
        if not page:
            continue
        publisher.counters.recipients += len(page)
        await publisher.publish(gateway_pb2.MODE_BROADCAST, BROADCAST_TOPIC, page)
