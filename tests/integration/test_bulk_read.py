"""The bulk reader against a real Redis, including the one redis-py internal it relies on.

If redis-py moves or renames the connection's stream reader, or changes what its pool
hands out, these fail (loudly, not by silently taking a slow path).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from router.redis.autopipe import RespBulkReader, _stream
from router.redis.client import create_redis
from router.routes.registry import BulkHashReads

pytestmark = pytest.mark.integration


@pytest.fixture(params=[3, 2], ids=["resp3", "resp2"])
async def one_connection(
    redis_url: str, request: pytest.FixtureRequest
) -> AsyncIterator[aioredis.Redis]:
    """A client like create_redis's, whose pool holds one connection: every command reuses it."""
    pool = aioredis.BlockingConnectionPool.from_url(
        redis_url, max_connections=1, timeout=5, decode_responses=True, protocol=request.param
    )
    client = aioredis.Redis.from_pool(pool)
    try:
        yield client
    finally:
        await client.aclose()


async def test_the_production_client_has_the_stream_the_reader_uses(redis_url: str) -> None:
    client = create_redis(redis_url)
    try:
        conn = await client.connection_pool.get_connection()
        try:
            assert isinstance(_stream(conn), asyncio.StreamReader)
        finally:
            await client.connection_pool.release(conn)
    finally:
        await client.aclose()


async def test_one_round_trip_and_the_connection_goes_back_in_sync(
    one_connection: aioredis.Redis, redis: aioredis.Redis, prefix: str
) -> None:
    keys = [f"{prefix}a", f"{prefix}missing", f"{prefix}zoë"]
    await redis.hset(keys[0], mapping={"c1": "v1", "c2": "v2"})
    await redis.hset(keys[2], "李", "ü")
    before = await one_connection.client_id()
    reads = BulkHashReads(one_connection)

    assert [sorted(v) for v in await reads.hvals(keys)] == [["v1", "v2"], [], ["ü"]]
    assert await reads.hgetall(keys) == [{"c1": "v1", "c2": "v2"}, {}, {"李": "ü"}]
    assert reads.reader.round_trips == 2
    # The same connection, and nothing left unread on it.
    assert await one_connection.client_id() == before
    assert await one_connection.hget(keys[0], "c1") == "v1"


async def test_an_error_reply_raises_once_every_reply_is_read(
    one_connection: aioredis.Redis, redis: aioredis.Redis, prefix: str
) -> None:
    await redis.set(f"{prefix}string", "x")
    await redis.hset(f"{prefix}hash", "f", "v")
    before = await one_connection.client_id()
    reader = RespBulkReader(one_connection)
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await reader.read("HVALS", [f"{prefix}hash", f"{prefix}string", f"{prefix}hash"])
    assert await one_connection.client_id() == before
    assert await reader.read("HVALS", [f"{prefix}hash"]) == [["v"]]


async def test_a_cancelled_read_disconnects_instead_of_pooling_unread_replies(
    one_connection: aioredis.Redis, redis: aioredis.Redis, prefix: str
) -> None:
    keys = [f"{prefix}big{i}" for i in range(50)]
    for key in keys:
        await redis.hset(key, "f", "x" * 50_000)  # 2.5 MB of replies: many socket reads
    pool = one_connection.connection_pool
    conn = await pool.get_connection()
    await pool.release(conn)
    before = await one_connection.client_id()
    reader = RespBulkReader(one_connection)

    task = asyncio.create_task(reader.read("HVALS", keys))
    while reader.round_trips == 0:  # the request is out; its replies are not all read yet
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not conn.is_connected  # dropped, not pooled with replies still coming
    after = await one_connection.client_id()
    assert isinstance(after, int) and after != before
    assert await reader.read("HVALS", keys[:1]) == [["x" * 50_000]]
