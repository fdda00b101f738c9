"""Group multicast: resolve recipients' groups in chunks, batch per group, publish.

The plan streams: recipients arrive in chunks (at most 1000 per Redis round trip), are
resolved to the group ids of their live routes (a few chunks ahead, so round trips
overlap), buffered per group by a GroupBatcher and leave as batches of at most
`batch_size`, so a million recipients are never expanded into per-user objects at once.

A resumable run (`run`) checkpoints between chunks, every CHECKPOINT_S or
CHECKPOINT_CHUNKS, and at once when its runner stops. It first publishes every buffer,
so that all recipients of the chunks done are published or counted; the chunks done
(with the last uid of the last one) say where a resumed run starts. The chunks after
the last checkpoint are sent again by the run that resumes: a recipient of them may get
the push twice, under one msg_id.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from functools import partial
from typing import Protocol

from router.fanout.batcher import GroupBatcher, ReadyBatch
from router.fanout.failures import publish_or_count
from router.fanout.outages import ride_out
from router.fanout.publisher import BatchPublisher, group_topic
from router.routes.base import LOOKUP_CHUNK, GroupLookup, RecipientGroups, chunks
from shared.clock import Clock
from shared.proto import gateway_pb2

__all__ = [
    "CHECKPOINT_CHUNKS",
    "CHECKPOINT_S",
    "LOOKAHEAD",
    "OnResolved",
    "Resumable",
    "chunked",
    "run_multicast",
]

# Told of each chunk once it is resolved, before any of its batches is published: its
# uids and who of them is online (the push's receipt).
OnResolved = Callable[[Sequence[str], RecipientGroups], Awaitable[None]]

# Look-ups in flight at once: while Redis answers one chunk, this process parses and
# batches the one before (see docs/benchmarks/index.md, multicast, for the measurements).
LOOKAHEAD = 3
# How often a resumable multicast checkpoints: every CHECKPOINT_S or CHECKPOINT_CHUNKS
# chunks (100,000 recipients), whichever comes first, so a resumed run sends again at
# most that much. Each checkpoint flushes every group's buffer early: one short batch per
# group at most, as its flush timeout (1 s) would soon.
CHECKPOINT_S = 2.0
CHECKPOINT_CHUNKS = 100


class Resumable(Protocol):
    """The run a multicast checkpoints through (`router.fanout.runner.JobRun`)."""

    @property
    def stopping(self) -> bool: ...

    async def checkpoint(self, after: str | None, pages: int) -> None: ...


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
    run: Resumable | None = None,
    done_chunks: int = 0,
    checkpoint_chunks: int = CHECKPOINT_CHUNKS,
) -> None:
    """Publish every online recipient to its group's topic; count the offline ones.
    `run`: checkpoint through it (`done_chunks`: how many a resumed run's input skips)."""
    if lookahead < 1:
        raise ValueError("lookahead must be at least 1")
    batcher = GroupBatcher(clock, batch_size, flush_timeout_s, high_priority=high_priority)
    done, last = done_chunks, None
    checkpointed = clock.monotonic()
    counters = publisher.counters
    lookups = _Lookups(chunks, registry)
    ahead: deque[asyncio.Task[tuple[Sequence[str], RecipientGroups]]] = deque()
    try:
        while True:
            while len(ahead) < lookahead:
                ahead.append(asyncio.ensure_future(lookups.next()))
            deadline = batcher.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - clock.monotonic())
            ready, _ = await asyncio.wait({ahead[0]}, timeout=timeout)
            if not ready:
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
                await on_resolved(chunk, found)
            if found.online < count:
                await publisher.record_offline(_offline(chunk, found))
            for group_id, uids in found.by_group.items():
                await _publish_all(publisher, batcher.add_many(group_id, uids))
            await _publish_all(publisher, batcher.chunk_done())
            done += 1
            last = chunk[-1] if chunk else last
            if run is not None and (
                run.stopping
                or (done - done_chunks) % checkpoint_chunks == 0
                or clock.monotonic() - checkpointed >= CHECKPOINT_S
            ):
                await _publish_all(publisher, batcher.drain())
                await run.checkpoint(last, done)
                checkpointed = clock.monotonic()
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
