"""router.redis.autopipe: concurrent single commands share round trips, on a real Redis,
and each caller gets its own reply or its own error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from router.redis.autopipe import AutoPipeline
from router.redis.client import create_redis
from router.redis.scripts import Script, ScriptRunner

pytestmark = pytest.mark.integration


@asynccontextmanager
async def pipelined(url: str, timeout_s: float = 5.0) -> AsyncIterator[tuple[Any, AutoPipeline]]:
    """A client of the Redis at `url` and an AutoPipeline over it, both closed after."""
    client = create_redis(url, timeout_s)
    auto = AutoPipeline(client)
    try:
        yield client, auto
    finally:
        await auto.aclose()
        await client.aclose()


def running_sums(n: int, keys: int) -> list[int]:
    """The replies to INCRBY i on key i % `keys`, for i in range(n), in order: each is
    the running sum of its key."""
    sums: dict[int, int] = {}
    expected = []
    for i in range(n):
        sums[i % keys] = sums.get(i % keys, 0) + i
        expected.append(sums[i % keys])
    return expected


async def test_concurrent_commands_share_round_trips(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    async with pipelined(redis_url) as (_client, auto):
        replies = await asyncio.gather(
            *(auto.execute("INCRBY", f"{prefix}n{i % 10}", i) for i in range(500))
        )
        # Each reply is its own command's: the running sum of its key, in order.
        assert replies == running_sums(500, 10)
        assert auto.commands == 500
        assert auto.round_trips == 1
        assert await redis.get(f"{prefix}n3") == str(sum(range(3, 500, 10)))
        # Hash reads come back as redis-py gives them (RESP3: a dict).
        await redis.hset(f"{prefix}h", mapping={"a": "1", "b": "ü"})
        assert await auto.execute("HGETALL", f"{prefix}h") in (
            {"a": "1", "b": "ü"},
            ["a", "1", "b", "ü"],
        )


async def test_an_error_reply_fails_only_its_own_command(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    async with pipelined(redis_url) as (_client, auto):
        await redis.hset(f"{prefix}h", "f", "v")
        results = await asyncio.gather(
            auto.execute("INCR", f"{prefix}a"),
            auto.execute("INCR", f"{prefix}h"),  # WRONGTYPE
            auto.execute("EVALSHA", "0" * 40, 0),  # NOSCRIPT
            auto.execute("INCR", f"{prefix}a"),
            return_exceptions=True,
        )
        assert results[0] == 1 and results[3] == 2
        assert isinstance(results[1], ResponseError)
        assert "WRONGTYPE" in str(results[1])
        assert isinstance(results[2], NoScriptError)
        assert auto.round_trips == 1


async def test_a_script_runner_loads_its_script_after_noscript(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    async with pipelined(redis_url) as (client, auto):
        script = Script(f"return redis.call('INCR', KEYS[1]) -- {prefix}")  # never loaded yet
        runner = ScriptRunner(client, [script], auto)
        assert await runner.one(script.args([f"{prefix}s"])) == 1
        assert await runner.many([script.args([f"{prefix}s"])] * 3) == [2, 3, 4]
        # A few calls, submitted together: an error reply is raised once all are in.
        await redis.hset(f"{prefix}h", "f", "v")
        incr, wrong = ("INCR", f"{prefix}y"), ("INCR", f"{prefix}h")
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await runner.many([incr, wrong, incr])
        assert await redis.get(f"{prefix}y") == "2"


async def test_calls_sent_soon_share_the_round_trip_of_a_command_awaited_first(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    async with pipelined(redis_url) as (client, auto):
        script = Script(f"return redis.call('INCR', KEYS[1]) -- soon {prefix}")
        runner = ScriptRunner(client, [script], auto)
        await redis.set(f"{prefix}other", "x")
        for _ in range(2):  # never loaded (NOSCRIPT, loaded, run again), then loaded
            trips = auto.round_trips
            sent = runner.soon([script.args([f"{prefix}s"])] * 2)
            # Sent before it is awaited: a command awaited first goes in the same trip.
            assert await auto.execute("GET", f"{prefix}other") == "x"
            assert auto.round_trips == trips + 1
            assert len(await sent) == 2
        assert await redis.get(f"{prefix}s") == "4"
        # Without an auto-pipeline, a task runs them: sent before it is awaited too.
        plain = ScriptRunner(client, [script])
        sent = plain.soon([script.args([f"{prefix}t"])])
        await asyncio.sleep(0.2)
        assert await redis.get(f"{prefix}t") == "1"
        assert await sent == [1]


async def test_many_calls_of_one_caller_are_packed_and_parsed_at_once(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    async with pipelined(redis_url) as (client, auto):
        script = Script(f"return redis.call('INCRBY', KEYS[1], ARGV[1]) -- many {prefix}")
        runner = ScriptRunner(client, [script], auto)
        # 2,500 calls: three round trips of at most 1000, replies in order; the script
        # was never loaded, so the first try fails whole (NOSCRIPT) and runs again.
        calls = [script.args([f"{prefix}m{i % 7}"], i) for i in range(2500)]
        replies = await runner.many(calls)
        assert replies == running_sums(2500, 7)
        assert auto.round_trips == 6  # 3 refused (NOSCRIPT), 3 after the load
        # An error reply among many is raised once all are read, as a pipeline's is.
        await redis.hset(f"{prefix}h", "f", "v")
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await auto.execute_many([("INCR", f"{prefix}x"), ("INCR", f"{prefix}h")] * 20)
        assert await redis.get(f"{prefix}x") == "20"
        assert await auto.execute("PING") in ("PONG", True)  # the connection is still good


async def test_a_cancelled_caller_leaves_the_others_their_replies(
    redis_url: str, prefix: str
) -> None:
    async with pipelined(redis_url) as (_client, auto):
        slow = asyncio.ensure_future(auto.execute("BLPOP", f"{prefix}never", 0.3))
        others = [asyncio.ensure_future(auto.execute("INCR", f"{prefix}c")) for _ in range(5)]
        await asyncio.sleep(0.05)
        slow.cancel()
        assert sorted(await asyncio.gather(*others)) == [1, 2, 3, 4, 5]
        # The connection went back to the pool in sync: the next commands read their own.
        assert await auto.execute("INCR", f"{prefix}c") == 6


async def test_a_redis_that_is_not_there_fails_every_caller_clearly(prefix: str) -> None:
    async with pipelined("redis://127.0.0.1:1/0", 1.0) as (_client, auto):
        results = await asyncio.gather(
            *(auto.execute("INCR", f"{prefix}x") for _ in range(3)), return_exceptions=True
        )
        assert all(isinstance(r, RedisConnectionError) for r in results), results
