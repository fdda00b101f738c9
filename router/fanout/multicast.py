"""Group multicast: resolve recipients' groups in chunks, batch per group, publish.

The plan streams: recipients arrive in chunks (at most 1000 per Redis round trip), are
resolved to the group ids of their live routes (a few chunks ahead, so round trips
overlap), buffered per group by a GroupBatcher and leave as batches of at most
`batch_size`, so a million recipients are never expanded into per-user objects at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from functools import partial

from router.fanout.batcher import GroupBatcher, ReadyBatch
from router.fanout.failures import publish_or_count
from router.fanout.outages import ride_out
from router.fanout.publisher import BatchPublisher, group_topic
from router.routes.base import LOOKUP_CHUNK, GroupLookup, RecipientGroups, chunks
from shared.clock import Clock
from shared.proto import gateway_pb2

__all__ = ["LOOKAHEAD", "OnResolved", "chunked", "run_multicast"]

# Told of each chunk once it is resolved, before any of its batches is published: its
# uids and who of them is online (the push's receipt).
OnResolved = Callable[[Sequence[str], RecipientGroups], Awaitable[None]]

# Look-ups in flight at once: while Redis answers one chunk, this process parses and
# batches the one before (see docs/benchmarks/index.md, multicast, for the measurements).
LOOKAHEAD = 3


async def chunked(uids: Iterable[str], size: int = LOOKUP_CHUNK) -> AsyncIterator[list[str]]:
    """An iterable of uids as chunks of at most `size`."""
    for chunk in chunks(uids, size):
        yield chunk
        await asyncio.sleep(0)  # let other pushes run between chunks


async def run_multicast(
    chunks: AsyncIterator[Sequence[str]],
    registry: GroupLookup,
    publisher: BatchPublisher,
    clock: Clock,
    *,
    batch_size: int = 1000,
    flush_timeout_s: float = 1.0,
    high_priority: bool = False,
    lookahead: int = LOOKAHEAD,
    on_resolved: OnResolved | None = None,
) -> None:
    """Publish every online recipient to its group's topic; count the offline ones."""
    if lookahead < 1:
        raise ValueError("lookahead must be at least 1")
    batcher = GroupBatcher(clock, batch_size, flush_timeout_s, high_priority=high_priority)
    counters = publisher.counters
    lookups = _Lookups(chunks, registry)
    ahead: deque[asyncio.Task[tuple[Sequence[str], RecipientGroups]]] = deque()
    try:
        while True:
            while len(ahead) < lookahead:
                ahead.append(asyncio.ensure_future(lookups.next()))
            deadline = batcher.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - clock.monotonic())
            done, _ = await asyncio.wait({ahead[0]}, timeout=timeout)
            if not done:
                # The input is slow: a buffer came due while we waited for it.
                await _publish_all(publisher, batcher.due())
                continue
            try:
                chunk, found = ahead.popleft().result()
            except StopAsyncIteration:
                break
            count = len(chunk)
            # Keep Redis busy with the next chunks while this one is batched and published.
            while len(ahead) < lookahead:
                ahead.append(asyncio.ensure_future(lookups.next()))
            counters.recipients += count
            counters.online += found.online
            counters.offline += count - found.online
            if on_resolved is not None:
                await ride_out(partial(on_resolved, chunk, found), "a multicast's receipt")
            if found.online < count:
                await publisher.record_offline(_offline(chunk, found))
            for group_id, uids in found.by_group.items():
                await _publish_all(publisher, batcher.add_many(group_id, uids))
            await _publish_all(publisher, batcher.chunk_done())
        await _publish_all(publisher, batcher.drain())
    finally:
        for task in ahead:
            task.cancel()
        # Let cancelled look-ups finish unwinding (their connections are disconnected,
        # not pooled with replies unread) before the caller moves on.
        await asyncio.gather(*ahead, return_exceptions=True)


class _Lookups:
    """Reads the next chunk of input and looks it up; several may run at once.

    The input is read one chunk at a time and in call order (an asyncio.Lock wakes its
    waiters first come, first served), while the look-ups' round trips overlap: Redis
    answers one chunk while this process parses the previous one and batches it.
    """

    def __init__(self, chunks: AsyncIterator[Sequence[str]], registry: GroupLookup) -> None:
        self._chunks = chunks
        self._registry = registry
        self._input = asyncio.Lock()

    async def next(self) -> tuple[Sequence[str], RecipientGroups]:
        """(the uids, who of them is online where); StopAsyncIteration at the end."""
        async with self._input:
            chunk = await anext(self._chunks)
        lookup = partial(self._registry.lookup_groups, chunk)
        return chunk, await ride_out(lookup, "a multicast's route look-up")


def _offline(chunk: Sequence[str], found: RecipientGroups) -> list[str]:
    online = {uid for uids in found.by_group.values() for uid in uids}
    return [uid for uid in chunk if uid not in online]


async def _publish_all(publisher: BatchPublisher, ready: Iterable[ReadyBatch]) -> None:
    for batch in ready:
        await _publish(publisher, batch)


async def _publish(publisher: BatchPublisher, ready: ReadyBatch) -> None:
    # A failed batch is counted and the multicast goes on with the next one.
    await publish_or_count(
        publisher,
        gateway_pb2.MODE_MULTICAST,
        group_topic(ready.group_id),
        ready.uids,
        group_id=ready.group_id,
    )
