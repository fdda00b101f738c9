"""Group multicast: resolve recipients' groups in chunks, batch per group, publish.

The plan streams: recipients arrive in chunks (at most 1000 per Redis round trip), are
buffered per group by a GroupBatcher and leave as batches of at most `batch_size`, so a
million recipients are never expanded into per-user objects all at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence

from router.batcher import GroupBatcher, ReadyBatch
from router.publishing import BatchPublisher, group_topic
from router.registry import LOOKUP_CHUNK, RouteRegistry, chunks
from shared.clock import Clock
from shared.proto import gateway_pb2

__all__ = ["chunked", "run_multicast"]


async def chunked(uids: Iterable[str], size: int = LOOKUP_CHUNK) -> AsyncIterator[list[str]]:
    """An iterable of uids as chunks of at most `size`."""
    for chunk in chunks(uids, size):
        yield chunk
        await asyncio.sleep(0)  # let other pushes run between chunks


async def run_multicast(
    chunks: AsyncIterator[Sequence[str]],
    registry: RouteRegistry,
    publisher: BatchPublisher,
    clock: Clock,
    *,
    batch_size: int = 1000,
    flush_timeout_s: float = 1.0,
    high_priority: bool = False,
) -> None:
    """Publish every online recipient to its group's topic; count the offline ones."""
    batcher = GroupBatcher(clock, batch_size, flush_timeout_s, high_priority=high_priority)
    counters = publisher.counters
    pending: asyncio.Task[Sequence[str]] | None = None
    try:
        while True:
            pending = pending or asyncio.ensure_future(anext(chunks))
            deadline = batcher.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - clock.monotonic())
            done, _ = await asyncio.wait({pending}, timeout=timeout)
            if not done:
                # The input is slow: a buffer came due while we waited for it.
                await _publish_all(publisher, batcher.due())
                continue
            try:
                chunk = pending.result()
            except StopAsyncIteration:
                pending = None
                break
            pending = None
            counters.recipients += len(chunk)
            routes = await registry.lookup(chunk)
            for uid in chunk:
                user_routes = routes.get(uid)
                if not user_routes:
                    counters.offline += 1
                    continue
                counters.online += 1
                # Several devices of one user in one group: the group gets the uid once.
                groups = (
                    (user_routes[0].group_id,)
                    if len(user_routes) == 1
                    else {route.group_id for route in user_routes}
                )
                for group_id in groups:
                    full = batcher.add(group_id, uid)
                    if full is not None:
                        await _publish(publisher, full)
            await _publish_all(publisher, batcher.chunk_done())
        await _publish_all(publisher, batcher.drain())
    finally:
        if pending is not None:
            pending.cancel()


async def _publish_all(publisher: BatchPublisher, ready: Iterable[ReadyBatch]) -> None:
    for batch in ready:
        await _publish(publisher, batch)


async def _publish(publisher: BatchPublisher, ready: ReadyBatch) -> None:
    await publisher.publish(
        gateway_pb2.MODE_MULTICAST,
        group_topic(ready.group_id),
        ready.uids,
        group_id=ready.group_id,
    )
