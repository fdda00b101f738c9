"""How the Redis Streams bus trims, against a real Redis: never what a live consumer
group has not read within IMROUTE_BUS_MAXLEN, exactly counted past it, and never held
for a group whose gateway left."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import pytest
import redis.asyncio as aioredis

from router.bus import BROADCAST, RedisStreamsBus
from router.bus.redis_streams import stream_key
from shared.keys import KeySchema
from tests.bus_reads import streams_subscribed, take
from tests.integration.stack import gateway

pytestmark = pytest.mark.integration


async def publish(bus: RedisStreamsBus, n: int, push_id: str = "p1", start: int = 0) -> None:
    for i in range(start, start + n):
        await bus.publish(BROADCAST, b"%d" % i, {"batch_id": f"b{i}", "push_id": push_id})


async def test_a_stream_without_subscribers_stays_within_the_bound(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    async with RedisStreamsBus(redis_url, prefix, maxlen=100) as bus:
        await publish(bus, 1000)
    # Nobody needs anything: trimmed (by whole stream nodes) below the bound.
    assert await redis.xlen(stream_key(prefix, BROADCAST)) <= 100
    assert bus.losses.unread_trimmed == {}


async def test_a_group_that_keeps_up_lets_the_stream_shrink(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    key = stream_key(prefix, BROADCAST)
    async with streams_subscribed(redis_url, prefix, maxlen=10_000) as (bus, messages):
        for round_ in range(3):
            await publish(bus, 300, start=300 * round_)
            for got in await take(messages, 300):
                await got.ack()
            await asyncio.sleep(1.05)  # the trim looks at the groups once a second
        await publish(bus, 1, start=900)
    # Not the last 10,000 entries (MAXLEN ~ kept those whoever had read them): only
    # what gw1 still needs, and what fell in a partly read stream node.
    assert await redis.xlen(key) <= 101
    assert bus.losses.unread_trimmed == {}


async def test_unread_entries_are_kept_to_the_bound_and_counted_past_it(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    key = stream_key(prefix, BROADCAST)
    lost_key = KeySchema(prefix).bus_lost(BROADCAST)
    async with streams_subscribed(redis_url, prefix, "reader", maxlen=100) as (bus, messages):
        await bus.prepare([BROADCAST], "stalled")  # subscribed, then never reads
        await publish(bus, 100)
        for got in await take(messages, 100):
            await got.ack()
        # Within the bound: everything stalled has not read is still there.
        assert await redis.xlen(key) == 100
        assert bus.losses.take("p1") == 0

        for start in range(100, 250, 10):  # reader keeps up; stalled falls behind
            await publish(bus, 10, start=start)
            for got in await take(messages, 10):
                await got.ack()
    assert await redis.xlen(key) == 100
    # The 150 oldest were trimmed before `stalled` read them: counted, exactly, in the
    # bus's losses, in Redis, and per push (each batch once).
    assert bus.losses.unread_trimmed == {(BROADCAST, "stalled"): 150}
    assert await redis.hgetall(lost_key) == {"stalled": "150"}
    assert bus.losses.take("p1") == 150
    assert bus.losses.take("p1") == 0

    async with RedisStreamsBus(redis_url, prefix) as late:
        async with aclosing(late.subscribe([BROADCAST], "stalled")) as messages:
            got = await take(messages, 100)
    assert [g.data for g in got] == [b"%d" % i for i in range(150, 250)]


async def test_a_group_idle_past_the_limit_is_dropped_and_holds_nothing(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    key = stream_key(prefix, BROADCAST)
    async with RedisStreamsBus(redis_url, prefix, maxlen=100, group_idle_s=0.3) as bus:
        await bus.prepare([BROADCAST], "departed")
        await publish(bus, 50)
        assert await redis.xlen(key) == 50  # departed may still come back for them
        await asyncio.sleep(1.1)
        await publish(bus, 200, push_id="p2", start=50)
    groups = await redis.xinfo_groups(key)
    assert groups == []
    assert await redis.xlen(key) <= 100
    # A gateway that left is not a gateway that lags: nothing counted as lost.
    assert bus.losses.unread_trimmed == {}
    assert bus.losses.groups_dropped == {BROADCAST: 1}
    assert bus.losses.take("p2") == 0


async def test_a_live_gateway_on_a_quiet_topic_keeps_its_group(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    """The finding: before Redis 7.2 a blocking read that gets nothing does not refresh
    its consumer's idle time, so a live gateway on a topic without traffic for
    IMROUTE_BUS_GROUP_IDLE_S (a group without a multicast for 10 min) had its group
    deleted as a departed gateway's, and missed the entry whose publish deleted it."""
    key = stream_key(prefix, BROADCAST)
    options = {"maxlen": 100, "group_idle_s": 1.0, "block_s": 0.2}
    async with streams_subscribed(redis_url, prefix, "live", **options) as (bus, messages):
        first = asyncio.ensure_future(take(messages, 1, timeout=10))
        await asyncio.sleep(2.5)  # quiet: no entry for over twice the idle limit
        await publish(bus, 1)
        [got] = await first
        await got.ack()
    assert got.data == b"0"
    assert [g["name"] for g in await redis.xinfo_groups(key)] == ["live"]
    assert bus.losses.groups_dropped == {}


async def test_a_gateway_that_stopped_cleanly_leaves_its_groups(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    """The finding: a gateway scaled in kept its groups for IMROUTE_BUS_GROUP_IDLE_S (10
    min), and every batch trimmed past the bound meanwhile was counted lost for it: a
    broadcast its clients had all got ended `failed`, 950 of 1000 batches "lost"."""
    key = stream_key(prefix, BROADCAST)
    async with gateway(redis_url, prefix, "gone", "g9", bus_maxlen=100):
        assert {g["name"] for g in await redis.xinfo_groups(key)} == {"gone"}
    async with RedisStreamsBus(redis_url, prefix, maxlen=100) as bus:
        assert await redis.xinfo_groups(key) == []
        await publish(bus, 300)
    assert bus.losses.unread_trimmed == {}
    assert bus.losses.take("p1") == 0
    assert await redis.xlen(key) <= 100
    group_key = stream_key(prefix, "group.g9")
    assert await redis.exists(group_key) == 0 or await redis.xinfo_groups(group_key) == []


@pytest.mark.parametrize(("maxlen", "per_read"), [(100, 10), (10_000, 100)])
async def test_one_read_holds_at_most_a_tenth_of_the_bound(
    redis_url: str, prefix: str, redis: aioredis.Redis, maxlen: int, per_read: int
) -> None:
    """What a running gateway holds read and not acked is one read: at a bound as small
    as a read (IMROUTE_BUS_MAXLEN 100), a whole read in hand would be trimmed and counted
    lost as soon as the publisher went on, though the gateway writes every entry."""
    async with streams_subscribed(redis_url, prefix, "reader", maxlen=maxlen) as (bus, messages):
        await publish(bus, 150)
        await take(messages, 1)
        held = await redis.xpending(stream_key(prefix, BROADCAST), "reader")
        assert held["pending"] == per_read
