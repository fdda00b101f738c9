"""Group multicast planning against a real Redis route registry.

The bus here is an in-memory recorder: what is under test is which batches the
planner publishes; the bus transports have their own contract tests.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis

from router.fanout.multicast import chunked, run_multicast
from router.fanout.publisher import BatchPublisher, PushCounters
from router.routes.registry import BulkHashReads, RedisRouteRegistry, Registration
from shared.clock import ManualClock, SystemClock
from shared.errors import RegistryRefused, RegistryUnavailable
from shared.keys import KeySchema
from shared.proto import gateway_pb2
from tests.integration.counting_pipelines import CountingPipelines
from tests.integration.recording_bus import RecordingBus, message

pytestmark = pytest.mark.integration


def gateway_registry(
    redis: aioredis.Redis, prefix: str, gateway_id: str, group_id: str, port: int
) -> RedisRouteRegistry:
    """The route registry of gateway `gateway_id` of group `group_id` (127.0.0.1:`port`)."""
    return RedisRouteRegistry(
        redis,
        KeySchema(prefix),
        SystemClock(),
        gateway_id=gateway_id,
        group_id=group_id,
        ip="127.0.0.1",
        port=port,
    )


GROUPS = ("g1", "g2", "g3", "g4")


async def online(redis: Any, prefix: str, uids: Sequence[str]) -> None:
    """Register each uid on a gateway of group GROUPS[i % 4]."""
    for g, group in enumerate(GROUPS):
        writer = gateway_registry(redis, prefix, f"gw-{group}", group, 9000 + g)
        await writer.refresh(Registration(u, f"c-{u}") for i, u in enumerate(uids) if i % 4 == g)


@pytest.mark.parametrize("path", ["bulk", "pipeline"])
@pytest.mark.parametrize("lookahead", [1, 3])
async def test_multicast_batches_per_group(
    redis: aioredis.Redis, prefix: str, path: str, lookahead: int
) -> None:
    uids = [f"u{i:05d}" for i in range(5000)]
    online_uids = uids[:4000]
    await online(redis, prefix, online_uids)
    counting = CountingPipelines(redis)
    # The standalone client reads in bulk; the wrapper, like a cluster client, pipelines.
    registry = RedisRouteRegistry(
        redis if path == "bulk" else counting, KeySchema(prefix), SystemClock()
    )
    bus = RecordingBus()
    counters = PushCounters()
    publisher = BatchPublisher(bus, message(), 0, counters)
    # Batches by size alone: the 1-s flush (tests/unit/test_batcher.py) would cut one short
    # on a machine too busy to read the 5001 routes within a second.
    await run_multicast(
        chunked([*uids, "ghost"]), registry, publisher, SystemClock(), lookahead=lookahead,
        flush_timeout_s=60,
    )  # fmt: skip

    assert (counters.recipients, counters.online, counters.offline) == (5001, 4000, 1001)
    # One round trip per 1000 recipients on either path.
    if isinstance(registry.reads, BulkHashReads):
        assert path == "bulk"
        assert registry.reads.reader.round_trips == math.ceil(5001 / 1000)
    else:
        assert path == "pipeline"
        assert counting.executions == math.ceil(5001 / 1000)
    per_group: dict[str, list[str]] = {}
    for topic, batch, attrs in bus.published:
        assert topic == f"group.{batch.group_id}"
        assert batch.mode == gateway_pb2.MODE_MULTICAST
        assert len(batch.uids) <= 1000
        assert attrs["batch_id"] == batch.batch_id and attrs["push_id"] == "p1"
        assert batch.message.msg_id == "m1"
        per_group.setdefault(batch.group_id, []).extend(batch.uids)
    for g, group in enumerate(GROUPS):
        expected = [u for i, u in enumerate(online_uids) if i % 4 == g]
        assert sorted(per_group[group]) == expected  # each exactly once
        assert counters.per_group[group] == math.ceil(len(expected) / 1000)
    assert counters.published == counters.batches == len(bus.published) == 4


async def test_a_slow_input_is_flushed_by_the_timeout(redis: aioredis.Redis, prefix: str) -> None:
    await online(redis, prefix, ["a", "b"])
    registry = RedisRouteRegistry(redis, KeySchema(prefix), SystemClock())
    bus = RecordingBus()
    publisher = BatchPublisher(bus, message(), 0, PushCounters())

    async def slow() -> AsyncIterator[list[str]]:
        yield ["a"]
        await asyncio.sleep(0.5)  # the input stalls; a's buffer must not wait for it
        yield ["b"]

    started = asyncio.get_running_loop().time()
    await run_multicast(slow(), registry, publisher, SystemClock(), flush_timeout_s=0.1)
    assert [list(b.uids) for _, b, _ in bus.published] == [["a"], ["b"]]
    assert 0.08 <= bus.times[0] - started < 0.4  # by the timeout, not at the end


async def test_high_priority_does_not_wait_for_the_buffer(
    redis: aioredis.Redis, prefix: str
) -> None:
    await online(redis, prefix, ["a", "b", "c", "d"])
    registry = RedisRouteRegistry(redis, KeySchema(prefix), SystemClock())
    bus = RecordingBus()
    publisher = BatchPublisher(bus, message(), 0, PushCounters())

    async def chunks() -> AsyncIterator[list[str]]:
        yield ["a"]
        await asyncio.sleep(0.3)
        yield ["b"]

    started = asyncio.get_running_loop().time()
    await run_multicast(
        chunks(), registry, publisher, SystemClock(), flush_timeout_s=10, high_priority=True
    )
    assert [list(b.uids) for _, b, _ in bus.published] == [["a"], ["b"]]
    assert bus.times[0] - started < 0.1


async def test_devices_in_one_group_count_once_even_across_a_flush(
    redis: aioredis.Redis, prefix: str
) -> None:
    registry = gateway_registry(redis, prefix, "gw-g1", "g1", 9000)
    other = gateway_registry(redis, prefix, "gw-g1b", "g1", 9001)
    await registry.refresh([Registration("alice", "c1"), Registration("bob", "c2")])
    await other.refresh([Registration("bob", "c3")])  # bob's second device, same group
    bus = RecordingBus()
    publisher = BatchPublisher(bus, message(), 0, PushCounters())
    await run_multicast(chunked(["alice", "bob"]), registry, publisher, SystemClock(), batch_size=2)
    assert [list(b.uids) for _, b, _ in bus.published] == [["alice", "bob"]]


class BrokenNode:
    """The route reads, where a chunk naming "broken" fails as a Redis node that stopped
    answering would (a key of another type fails only its own read, which is no error:
    tests/integration/test_registry.py)."""

    def __init__(self, inner: BulkHashReads) -> None:
        self.inner = inner

    async def hgetall(self, keys: Sequence[str]) -> Sequence[Mapping[str, str] | RegistryRefused]:
        return await self.inner.hgetall(keys)

    async def hvals(
        self, keys: Sequence[str], prefix: str = ""
    ) -> Sequence[list[str] | RegistryRefused]:
        if "broken" in keys:
            raise RegistryUnavailable("redis did not answer: the node of 'broken' went away")
        return await self.inner.hvals(keys, prefix)


async def test_a_failed_look_up_ahead_surfaces_in_order_and_leaves_nothing_running(
    redis: aioredis.Redis, prefix: str
) -> None:
    await online(redis, prefix, ["a", "b"])
    reads = BrokenNode(BulkHashReads(redis))
    registry = RedisRouteRegistry(redis, KeySchema(prefix), SystemClock(), reads=reads)
    bus = RecordingBus()
    publisher = BatchPublisher(bus, message(), 0, PushCounters())
    before = asyncio.all_tasks()

    async def chunks() -> AsyncIterator[list[str]]:
        yield ["a"]
        yield ["broken"]  # looked up while "a" is batched
        yield ["b"]

    with pytest.raises(RegistryUnavailable, match="went away"):
        await run_multicast(chunks(), registry, publisher, SystemClock(), batch_size=1, lookahead=3)
    assert [list(b.uids) for _, b, _ in bus.published] == [["a"]]  # what came before the error
    assert asyncio.all_tasks() == before  # the look-ups ahead were cancelled and awaited


async def test_lookahead_must_be_positive(redis: aioredis.Redis, prefix: str) -> None:
    registry = RedisRouteRegistry(redis, KeySchema(prefix), SystemClock())
    publisher = BatchPublisher(RecordingBus(), message(), 0, PushCounters())
    with pytest.raises(ValueError, match="lookahead"):
        await run_multicast(chunked(["a"]), registry, publisher, SystemClock(), lookahead=0)


class Stopped(Exception):
    pass


class Run:
    """A job run that stops at its `stop_at`-th checkpoint; records each checkpoint and
    what the bus had by then."""

    def __init__(self, bus: RecordingBus, stop_at: int = 0, stopping: bool = True) -> None:
        self.bus = bus
        self.stop_at = stop_at
        self.checkpoints: list[tuple[str | None, int, set[str]]] = []
        self._stopping = stopping

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def checkpoint(self, after: str | None, pages: int) -> None:
        published = {u for _, b, _ in self.bus.published for u in b.uids}
        self.checkpoints.append((after, pages, published))
        if len(self.checkpoints) == self.stop_at:
            raise Stopped


async def test_a_multicast_checkpoints_between_chunks_with_every_buffer_published(
    redis: aioredis.Redis, prefix: str
) -> None:
    uids = [f"u{i:05d}" for i in range(3500)]
    online_uids = set(uids[::2])
    await online(redis, prefix, sorted(online_uids))
    registry = RedisRouteRegistry(redis, KeySchema(prefix), SystemClock())
    bus = RecordingBus()
    run = Run(bus)  # its runner stopping: a checkpoint after every chunk
    publisher = BatchPublisher(bus, message(), 0, PushCounters())
    await run_multicast(chunked(uids), registry, publisher, SystemClock(), run=run)
    assert [(after, pages) for after, pages, _ in run.checkpoints] == [
        ("u00999", 1),
        ("u01999", 2),
        ("u02999", 3),
        ("u03499", 4),
    ]
    for after, _, published in run.checkpoints:
        assert published == {u for u in online_uids if u <= str(after)}  # nothing buffered
    # Not stopping, and no time passing: a checkpoint every `checkpoint_chunks` only.
    quiet = Run(RecordingBus(), stopping=False)
    publisher = BatchPublisher(quiet.bus, message(), 0, PushCounters())
    clock = ManualClock()
    await run_multicast(chunked(uids), registry, publisher, clock, run=quiet, checkpoint_chunks=2)
    assert [(after, pages) for after, pages, _ in quiet.checkpoints] == [
        ("u01999", 2),
        ("u03499", 4),
    ]
    assert len(quiet.bus.published) == 8  # 1750 online in 4 groups: flushed at 2 chunks
    none = Run(RecordingBus(), stopping=False)
    publisher = BatchPublisher(none.bus, message(), 0, PushCounters())
    await run_multicast(chunked(uids), registry, publisher, clock, run=none)
    assert none.checkpoints == []
    assert len(none.bus.published) == 4  # one full batch per group, none cut early


async def test_a_multicast_resumed_at_its_checkpoint_sends_the_rest_once(
    redis: aioredis.Redis, prefix: str
) -> None:
    uids = [f"u{i:05d}" for i in range(3500)]
    online_uids = uids[::2]
    await online(redis, prefix, online_uids)
    registry = RedisRouteRegistry(redis, KeySchema(prefix), SystemClock())
    bus = RecordingBus()
    first = Run(bus, stop_at=2)
    counters = PushCounters()
    with pytest.raises(Stopped):
        await run_multicast(
            chunked(uids),
            registry,
            BatchPublisher(bus, message(), 0, counters),
            SystemClock(),
            run=first,
        )
    after, done, _ = first.checkpoints[-1]
    assert (after, done) == ("u01999", 2)
    resumed = counters.copy()  # what the checkpoint kept
    second = Run(bus, stopping=False)
    await run_multicast(
        chunked(uids[done * 1000 :]),
        registry,
        BatchPublisher(bus, message(), 0, resumed),
        SystemClock(),
        run=second,
        done_chunks=done,
    )
    got = sorted(u for _, b, _ in bus.published for u in b.uids)
    assert got == sorted(online_uids)  # each once: the stop fell at the checkpoint
    assert (resumed.recipients, resumed.online, resumed.offline) == (3500, 1750, 1750)
