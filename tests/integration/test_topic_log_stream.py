"""A topic's recovery log is its bus stream (the Redis Streams bus on the recovery
store's Redis): a broadcast or multicast batch is written once, by its publish, and the
reads that resumes and gap fills make find it in the same stream, by position."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

import pytest
import redis.asyncio as aioredis

from router.bus import BROADCAST, group_topic
from router.bus.base import NEXT_SEQ, SEQ
from router.bus.factory import open_bus
from router.bus.hedged import HedgedBus
from router.bus.redis_streams import TopicLog
from router.bus.transport import BusTransport
from router.fanout.publisher import BatchPublisher
from router.jobs.base import PushCounters
from router.recovery.base import RecoveryLimits
from router.recovery.store import RedisRecoveryStore
from shared.clock import SystemClock
from shared.keys import KeySchema
from shared.models import Message
from shared.positions import counter_of, epoch_of, seq_of
from shared.proto import gateway_pb2
from tests.bus_reads import take

pytestmark = pytest.mark.integration

G1 = group_topic("g1")
WINDOW = TopicLog(window_ms=300_000, max_entries=2000)
N_TRIM = 350


@pytest.fixture
async def bus(redis_url: str, prefix: str) -> AsyncIterator[HedgedBus[BusTransport]]:
    async with open_bus(redis_url, prefix, topic_log=WINDOW) as opened:
        yield opened


def store_of(redis: aioredis.Redis, prefix: str, *, on_bus: bool = True) -> RedisRecoveryStore:
    return RedisRecoveryStore(
        redis, KeySchema(prefix), SystemClock(), RecoveryLimits(), topics_on_bus=on_bus
    )


def message(i: int, content: bytes = b'{"n":1}') -> Message:
    return Message(f"m{i}", f"p{i}", 0, "admin", content, 1000 + i)


async def publish(
    bus: object, store: RedisRecoveryStore, i: int, topic: str = BROADCAST, content: bytes = b"{}"
) -> None:
    mode = gateway_pb2.MODE_BROADCAST if topic == BROADCAST else gateway_pb2.MODE_MULTICAST
    publisher = BatchPublisher(bus, message(i, content), 0, PushCounters(), store)  # type: ignore[arg-type]
    await publisher.publish(mode, topic, [f"u{i}", "everyone-else"], group_id="")


def counters(batches: list[gateway_pb2.Batch] | list[int]) -> list[int]:
    return [counter_of(b if isinstance(b, int) else b.seq) for b in batches]


async def test_a_publish_is_the_one_write_and_the_log_reads_it_back(
    bus: HedgedBus[BusTransport], redis: aioredis.Redis, prefix: str
) -> None:
    store = store_of(redis, prefix)
    await bus.prepare([BROADCAST], "gw1")
    big = b'{"text":"' + b"x" * 4000 + b'"}'  # stored once for the push, named by batches
    for i in range(1, 6):
        await publish(bus, store, i, content=big if i == 3 else b"{}")
    keys = KeySchema(prefix)
    assert not await redis.exists(keys.topic_log(BROADCAST))  # no second copy
    assert await redis.xlen(keys.bus_stream(BROADCAST)) == 5

    async with aclosing(bus.subscribe([BROADCAST], "gw1")) as received:
        got = await take(received, 5)
    places = [(int(r.attributes["seq"]), int(r.attributes["epoch"])) for r in got]
    epoch = places[0][1]
    assert places == [(n, epoch) for n in range(1, 6)]  # the stream's order is the log's

    history = await store.read_topic(BROADCAST, 0)
    assert history.head == seq_of(epoch, 5)
    assert [lb.seq for lb in history.batches] == [seq_of(epoch, n) for n in range(1, 6)]
    assert [lb.batch.message.push_id for lb in history.batches] == [f"p{i}" for i in range(1, 6)]
    assert history.batches[2].batch.message.content_json == big  # the stored content, filled
    after_two = await store.read_topic(BROADCAST, seq_of(epoch, 2), seq_of(epoch, 4))
    assert counters([lb.seq for lb in after_two.batches]) == [3, 4]
    assert await store.heads([BROADCAST, G1]) == [seq_of(epoch, 5), 0]


async def test_a_batch_published_again_at_once_is_the_entry_it_already_is(
    bus: HedgedBus[BusTransport], redis: aioredis.Redis, prefix: str
) -> None:
    """A retry whose first attempt got through, or a hedge: one entry, one place."""
    data = b"batch"
    attributes = {"batch_id": "b1", "push_id": "p1", SEQ: NEXT_SEQ}
    first = await bus.publish(BROADCAST, data, attributes)
    again = await bus.publish(BROADCAST, data, attributes)
    other = await bus.publish(BROADCAST, data, {"batch_id": "b2", "push_id": "p1", SEQ: NEXT_SEQ})
    assert first == again != other
    stream = KeySchema(prefix).bus_stream(BROADCAST)
    assert await redis.xlen(stream) == 2
    head = (await store_of(redis, prefix).heads([BROADCAST]))[0]
    assert counter_of(head) == 2


async def test_entries_every_gateway_read_stay_for_the_window(
    redis_url: str, redis: aioredis.Redis, prefix: str
) -> None:
    """The trim that leaves a plain bus stream holding about what is in flight keeps
    the log's window in a stream that is the log. (Redis trims whole nodes of 100
    entries: hence a few hundred.)"""
    stream = KeySchema(prefix).bus_stream(BROADCAST)
    for topic_log in (WINDOW, None):
        await redis.delete(stream)
        async with open_bus(redis_url, prefix, topic_log=topic_log) as bus:
            await bus.prepare([BROADCAST], "gw1")
            for i in range(N_TRIM):
                await bus.publish(BROADCAST, b"x", {"batch_id": f"b{i}", SEQ: NEXT_SEQ})
            async with aclosing(bus.subscribe([BROADCAST], "gw1")) as received:
                for r in await take(received, N_TRIM):
                    await r.ack()
            bus.transport._checked.clear()  # type: ignore[attr-defined]  # look at the groups now
            await bus.publish(BROADCAST, b"x", {"batch_id": "last", SEQ: NEXT_SEQ})
        left = await redis.xlen(stream)
        if topic_log is None:
            assert left <= 100, left  # all that gw1 acked, but the newest node
        else:
            assert left == N_TRIM + 1


async def past_its_bound(redis_url: str, redis: aioredis.Redis, prefix: str) -> RedisRecoveryStore:
    """N_TRIM batches logged in a stream bounded at 100, its groups looked at every time."""
    store = store_of(redis, prefix)
    async with open_bus(redis_url, prefix, topic_log=TopicLog(300_000, 100)) as bus:
        for i in range(1, N_TRIM + 1):
            bus.transport._checked.clear()  # type: ignore[attr-defined]
            await publish(bus, store, i)
    return store


async def test_past_its_bound_the_log_keeps_its_newest_entries(
    redis_url: str, redis: aioredis.Redis, prefix: str
) -> None:
    store = await past_its_bound(redis_url, redis, prefix)
    history = await store.read_topic(BROADCAST, 0)
    kept = counters([lb.seq for lb in history.batches])
    assert kept == list(range(kept[0], N_TRIM + 1))
    assert 1 < kept[0] <= N_TRIM - 99, kept[0]  # the newest 100 at least, not all
    # A position whose entries went reads what is left: the caller sees the hole.
    span = await store.read_span(BROADCAST, seq_of(epoch_of(history.head), 1), None, 0, 0)
    assert counters([lb.seq for lb in span.batches]) == kept


@pytest.mark.parametrize("on_bus", [True, False], ids=["stream", "list"])
async def test_a_read_within_a_budget_is_the_same_on_both_logs(
    on_bus: bool, bus: HedgedBus[BusTransport], redis_url: str, redis: aioredis.Redis, prefix: str
) -> None:
    """read_span's contract, on the stream and on the list: over `max_entries`, the
    newest that fit and `start`; over `max_bytes`, likewise; with `upto`, nothing above."""
    store = store_of(redis, prefix, on_bus=on_bus)
    async with open_bus(redis_url, prefix, topic_log=WINDOW if on_bus else None) as used:
        for i in range(1, 11):
            await publish(used, store, i, topic=G1)
    head = (await store.heads([G1]))[0]
    e = epoch_of(head)

    span = await store.read_span(G1, seq_of(e, 2), None, 3, 0)
    assert (counters([b.seq for b in span.batches]), span.over, counter_of(span.start)) == (
        [8, 9, 10],
        True,
        7,
    )
    span = await store.read_span(G1, seq_of(e, 2), seq_of(e, 6), 10, 0)
    assert (counters([b.seq for b in span.batches]), span.over) == ([3, 4, 5, 6], False)
    one = span.sizes[0]
    span = await store.read_span(G1, 0, seq_of(e, 9), 0, one * 3 + one // 2)
    assert (counters([b.seq for b in span.batches]), span.over, counter_of(span.start)) == (
        [7, 8, 9],
        True,
        6,
    )
    assert len(span.sizes) == 3 and all(s > 0 for s in span.sizes)
    # `upto` of an earlier epoch reads nothing; `after` of another epoch reads from the start.
    assert (await store.read_span(G1, 0, seq_of(e - 1, 9), 0, 0)).batches == []
    whole = await store.read_topic(G1, seq_of(e - 1, 9))
    assert counters([b.seq for b in whole.batches]) == list(range(1, 11))


async def test_during_the_upgrade_the_list_and_the_stream_are_read_as_one_log(
    redis_url: str, redis: aioredis.Redis, prefix: str
) -> None:
    """Push services upgrade after the gateways: the older ones log apart (the list) and
    publish entries without a place; an upgraded one's publish is the log. An upgraded
    reader reads both, in order, each batch once."""
    old_store = store_of(redis, prefix, on_bus=False)
    new_store = store_of(redis, prefix)
    async with (
        open_bus(redis_url, prefix) as old_bus,
        open_bus(redis_url, prefix, topic_log=WINDOW) as new_bus,
    ):
        for i in (1, 2, 3):
            await publish(old_bus, old_store, i)
        await publish(new_bus, new_store, 4)
        await publish(old_bus, old_store, 5)  # one not yet restarted
        await publish(new_bus, new_store, 6)
    history = await new_store.read_topic(BROADCAST, 0)
    assert counters([lb.seq for lb in history.batches]) == [1, 2, 3, 4, 5, 6]
    assert [lb.batch.message.push_id for lb in history.batches] == [f"p{i}" for i in range(1, 7)]
    e = epoch_of(history.head)
    span = await new_store.read_span(BROADCAST, seq_of(e, 1), None, 3, 0)
    assert (counters([b.seq for b in span.batches]), span.over) == ([4, 5, 6], True)


async def test_a_sequence_redis_lost_starts_the_log_again_under_a_new_epoch(
    bus: HedgedBus[BusTransport], redis: aioredis.Redis, prefix: str
) -> None:
    store = store_of(redis, prefix)
    for i in (1, 2, 3):
        await publish(bus, store, i)
    old = (await store.heads([BROADCAST]))[0]
    await redis.delete(KeySchema(prefix).topic_seq(BROADCAST))  # a shard lost it
    await asyncio.sleep(0.002)  # the new epoch is the Redis clock in ms: a later one
    for i in (4, 5):
        await publish(bus, store, i)
    new = (await store.heads([BROADCAST]))[0]
    assert epoch_of(new) > epoch_of(old) and counter_of(new) == 2
    # From the old epoch's position: the new log from its start, none of the old entries.
    history = await store.read_topic(BROADCAST, old)
    assert [lb.batch.message.push_id for lb in history.batches] == ["p4", "p5"]
    assert [lb.seq for lb in history.batches] == [seq_of(epoch_of(new), 1), new]


async def test_a_push_not_stored_is_no_part_of_the_log(
    bus: HedgedBus[BusTransport], redis: aioredis.Redis, prefix: str
) -> None:
    """`store: false` (no recovery log for the push): its batch is on the bus for the
    gateways, without a place; the log's sequence does not move."""
    store = store_of(redis, prefix)
    await bus.prepare([BROADCAST], "gw1")
    await publish(bus, store, 1)
    unstored = BatchPublisher(bus, message(2), 0, PushCounters(), None)
    await unstored.publish(gateway_pb2.MODE_BROADCAST, BROADCAST, ["u2"])
    await publish(bus, store, 3)
    async with aclosing(bus.subscribe([BROADCAST], "gw1")) as received:
        got = await take(received, 3)
    assert [r.attributes.get("seq") for r in got] == ["1", None, "2"]
    history = await store.read_topic(BROADCAST, 0)
    assert [lb.batch.message.push_id for lb in history.batches] == ["p1", "p3"]
    assert counters([lb.seq for lb in history.batches]) == [1, 2]
    span = await store.read_span(BROADCAST, 0, None, 1, 0)  # past the unplaced one
    assert ([lb.batch.message.push_id for lb in span.batches], span.over) == (["p3"], True)


async def test_a_repeat_after_another_batch_is_an_entry_of_its_own(
    bus: HedgedBus[BusTransport], redis: aioredis.Redis, prefix: str
) -> None:
    placed = {SEQ: NEXT_SEQ, "push_id": "p"}
    first = await bus.publish(BROADCAST, b"a", {**placed, "batch_id": "A"})
    await bus.publish(BROADCAST, b"x", {SEQ: NEXT_SEQ, "push_id": "p"})  # no batch id
    again = await bus.publish(BROADCAST, b"a", {**placed, "batch_id": "A"})
    await bus.publish(BROADCAST, b"y", {"batch_id": "Y", "push_id": "p"})  # not placed
    last = await bus.publish(BROADCAST, b"a", {**placed, "batch_id": "A"})
    assert len({first, again, last}) == 3
    assert await redis.xlen(KeySchema(prefix).bus_stream(BROADCAST)) == 5
    assert counter_of((await store_of(redis, prefix).heads([BROADCAST]))[0]) == 4


@pytest.mark.parametrize("legacy_writes", [False, True])
async def test_while_older_push_services_trim_the_stream_legacy_writes_keep_the_log(
    legacy_writes: bool, redis_url: str, redis: aioredis.Redis, prefix: str
) -> None:
    """Step 2 of the upgrade: a push service of the version before (a bus without the
    log's window) trims the stream down to what the gateways read; an upgraded one's
    batches survive it only where it logs them in the list too."""
    store = store_of(redis, prefix)
    async with (
        open_bus(redis_url, prefix) as old_bus,
        open_bus(redis_url, prefix, topic_log=None if legacy_writes else WINDOW) as new_bus,
    ):
        await old_bus.prepare([BROADCAST], "gw1")
        for i in range(1, N_TRIM + 1):
            await publish(new_bus, store, i)
        async with aclosing(old_bus.subscribe([BROADCAST], "gw1")) as received:
            for r in await take(received, N_TRIM):
                await r.ack()
        old_bus.transport._checked.clear()  # type: ignore[attr-defined]
        await old_bus.publish(BROADCAST, b"x", {"batch_id": "old", "push_id": "p-old"})
    kept = counters([lb.seq for lb in (await store.read_topic(BROADCAST, 0)).batches])
    if legacy_writes:
        assert kept == list(range(1, N_TRIM + 1))
    else:
        assert len(kept) < N_TRIM - 100  # what the gateway had read went with the trim


async def test_over_the_budget_on_a_log_shorter_than_it_says_where_it_starts(
    redis_url: str, redis: aioredis.Redis, prefix: str
) -> None:
    store = await past_its_bound(redis_url, redis, prefix)
    head = (await store.heads([BROADCAST]))[0]
    e = epoch_of(head)
    kept = counters([lb.seq for lb in (await store.read_topic(BROADCAST, 0)).batches])
    assert kept[0] > 1
    span = await store.read_span(BROADCAST, seq_of(e, 1), None, N_TRIM - 10, 0)
    assert span.over and counters([b.seq for b in span.batches]) == kept
    assert span.start == seq_of(e, kept[0] - 1)  # all that is there comes after it
