"""Broadcast: one batch per directory page, published once to every gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from router.directory.base import PageReader, pages_after
from router.fanout.failures import publish_or_count
from router.fanout.publisher import BROADCAST_TOPIC, BatchPublisher
from shared.proto import gateway_pb2

__all__ = ["Checkpoints", "PageReader", "pages_after", "run_broadcast"]


class Checkpoints(Protocol):
    """Where a resumable broadcast records each page done (JobRun.checkpoint)."""

    async def __call__(self, after: str | None, pages: int) -> None: ...


async def run_broadcast(
    pages: AsyncIterator[Sequence[str]] | None,
    publisher: BatchPublisher,
    *,
    checkpoint: Checkpoints | None = None,
    done_pages: int = 0,
    after: str | None = None,
) -> None:
    """Publish each page of uids as one batch; `pages` None means everyone online.

    Every gateway receives every batch and delivers to the listed uids it holds, so a
    page costs one publish however many gateways there are. "Everyone online" reads no
    directory: one batch tells each gateway to write to all its local connections.

    A page whose batch failed is counted and the broadcast goes on (`publish_or_count`).
    After each page, `checkpoint(last uid, pages done)`; a resumed broadcast passes the
    pages already done, and `pages` and `after` starting after the last uid done.
    """
    if pages is None:
        if done_pages == 0:
            await publish_or_count(
                publisher, gateway_pb2.MODE_BROADCAST, BROADCAST_TOPIC, everyone=True
            )
            if checkpoint is not None:
                await checkpoint(None, 1)
        return
    n = done_pages
    async for page in pages:
        if not page:
            continue
        publisher.counters.recipients += len(page)
        await publish_or_count(
            publisher, gateway_pb2.MODE_BROADCAST, BROADCAST_TOPIC, page, after=after
        )
        after = page[-1]
        n += 1
        if checkpoint is not None:
            await checkpoint(after, n)
