"""A write of megabytes on a connection of its own, dropped after, against a real Redis."""

from __future__ import annotations

import pytest

from router.redis.client import GentleRedisCluster, connect_redis, own_connection

pytestmark = pytest.mark.integration


async def test_the_block_has_one_connection_that_the_pool_never_hands_out_again(
    redis_url: str, prefix: str
) -> None:
    async with connect_redis(redis_url) as client:
        await client.ping()  # one pooled connection, idle
        async with own_connection(client) as one:
            assert one is not client
            await one.set(f"{prefix}big", "x" * (2 << 20))
            used = one.connection
            assert used is not None and used.is_connected
            assert await one.strlen(f"{prefix}big") == 2 << 20  # the same connection
            assert one.connection is used
        assert not used.is_connected  # back in the pool closed: the next user reconnects
        assert await client.get(f"{prefix}missing") is None  # the pool goes on
        assert await client.strlen(f"{prefix}big") == 2 << 20
        await client.delete(f"{prefix}big")


async def test_a_cluster_client_is_given_as_it_is() -> None:
    cluster = GentleRedisCluster.from_url("redis://127.0.0.1:1")  # not connected: lazy
    async with own_connection(cluster) as one:
        assert one is cluster
