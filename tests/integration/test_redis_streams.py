"""What only the Redis Streams transport does, against a real Redis: XAUTOCLAIM,
trimming, MAXLEN, and a stream that vanishes."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import pytest
import redis.asyncio as aioredis

from router.bus import BROADCAST, RedisStreamsBus
from router.bus.redis_streams import stream_key
from tests.bus_reads import assert_quiet, streams_subscribed, take

pytestmark = pytest.mark.integration


async def test_xautoclaim_takes_over_an_entry_stuck_on_another_consumer(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    key = stream_key(prefix, BROADCAST)
    async with RedisStreamsBus(redis_url, prefix, claim_idle_s=0.05) as bus:
        await bus.prepare([BROADCAST], "gw1")
        message_id = await bus.publish(BROADCAST, b"stuck")
        # An earlier boot of gw1 that read under another consumer name, then died.
        await redis.xreadgroup("gw1", "gw1-old-boot", {key: ">"})

        # Not idle long enough for the default min-idle: left where it is.
        async with RedisStreamsBus(redis_url, prefix) as patient:
            async with aclosing(patient.subscribe([BROADCAST], "gw1")) as messages:
                await assert_quiet(messages)

        await asyncio.sleep(0.1)
        async with aclosing(bus.subscribe([BROADCAST], "gw1")) as messages:
            (got,) = await take(messages, 1)
            assert (got.message_id, got.data) == (message_id, b"stuck")
            await got.ack()
    pending = await redis.xpending(key, "gw1")
    assert pending["pending"] == 0


async def test_an_entry_trimmed_while_pending_is_skipped_and_acked(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    key = stream_key(prefix, BROADCAST)
    async with RedisStreamsBus(redis_url, prefix) as bus:
        await bus.prepare([BROADCAST], "gw1")
        trimmed = await bus.publish(BROADCAST, b"trimmed")
        await bus.publish(BROADCAST, b"kept")
        async with aclosing(bus.subscribe([BROADCAST], "gw1")) as messages:
            await take(messages, 2)  # and no ack
    await redis.xdel(key, trimmed)
    async with RedisStreamsBus(redis_url, prefix) as bus:
        async with aclosing(bus.subscribe([BROADCAST], "gw1")) as messages:
            (got,) = await take(messages, 1)
            assert got.data == b"kept"
            await got.ack()
    assert (await redis.xpending(key, "gw1"))["pending"] == 0


async def test_maxlen_caps_the_stream(redis_url: str, prefix: str, redis: aioredis.Redis) -> None:
    async with RedisStreamsBus(redis_url, prefix, maxlen=1000) as bus:
        await bus.prepare([BROADCAST], "stalled")  # never reads: holds what it can
        for start in range(0, 5000, 500):
            await asyncio.gather(
                *(bus.publish(BROADCAST, b"%d" % i) for i in range(start, start + 500))
            )
    # Past the bound the oldest go, exactly to it, and are counted (test_redis_streams_trim).
    assert await redis.xlen(stream_key(prefix, BROADCAST)) == 1000
    assert bus.losses.unread_trimmed == {(BROADCAST, "stalled"): 4000}


async def test_a_subscriber_recovers_when_its_stream_vanishes(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    # Redis losing its data (a restart without persistence) looks like this: the key and
    # its groups are gone, XREADGROUP fails, and the loop must re-create them and go on.
    key = stream_key(prefix, BROADCAST)
    async with streams_subscribed(redis_url, prefix, block_s=0.2) as (bus, messages):
        first = asyncio.create_task(anext(messages))
        await asyncio.sleep(0.1)
        await redis.delete(key)
        for _ in range(100):  # the loop re-creates the key with its group
            if await redis.exists(key):
                break
            await asyncio.sleep(0.02)
        else:
            pytest.fail("the subscriber did not re-create its group")
        await bus.publish(BROADCAST, b"after the loss")
        got = await asyncio.wait_for(first, 2)
        assert got.data == b"after the loss"
