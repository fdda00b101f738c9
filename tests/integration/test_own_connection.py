"""A write of megabytes on a connection of its own, dropped after, against a real Redis."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from router.redis.client import GentleRedisCluster, connect_redis, own_connection

pytestmark = pytest.mark.integration


def idle(client: aioredis.Redis) -> list[object]:
    """The pool's connections not handed out (redis-py's pool internals)."""
    return list(client.connection_pool._available_connections)


async def test_the_block_has_one_connection_which_goes_back_to_the_pool_closed(
    redis_url: str, prefix: str
) -> None:
    async with connect_redis(redis_url) as client:
        assert isinstance(client, aioredis.Redis)
        await client.ping()  # one pooled connection, idle
        async with own_connection(client) as one:
            assert one is not client
            await one.set(f"{prefix}big", "x" * (2 << 20))
            used = one.connection
            assert used is not None and used.is_connected
            assert await one.strlen(f"{prefix}big") == 2 << 20  # the same connection
            assert one.connection is used
        assert not used.is_connected  # closed: whoever takes it next reconnects
        assert used in idle(client)  # released, not lost to the pool
        assert client.connection_pool._in_use_connections == set()
        assert await client.strlen(f"{prefix}big") == 2 << 20  # the pool goes on
        await client.delete(f"{prefix}big")


async def test_a_block_that_sends_nothing_takes_no_connection(redis_url: str) -> None:
    async with connect_redis(redis_url) as client:
        assert isinstance(client, aioredis.Redis)
        with pytest.raises(RuntimeError, match="before any command"):
            async with own_connection(client) as one:
                raise RuntimeError("before any command")
        assert one.connection is None
        assert client.connection_pool._in_use_connections == set()
        assert await client.ping()


async def test_a_cluster_client_is_given_as_it_is() -> None:
    cluster = GentleRedisCluster.from_url("redis://127.0.0.1:1")  # not connected: lazy
    async with own_connection(cluster) as one:
        assert one is cluster
