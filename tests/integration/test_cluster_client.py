"""The cluster client's own resets leave other tasks' commands alone (real cluster)."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from router.redis.client import GentleRedisCluster, connect_redis, ping, unanswered
from router.redis.scripts import Script, ScriptRunner
from shared.keys import KeySchema
from tests.integration.redis_cluster import LocalCluster, cluster_nodes
from tests.integration.stack import route_registry

pytestmark = pytest.mark.integration


async def test_a_reset_after_moved_spares_a_command_in_flight(
    redis_cluster: LocalCluster, prefix: str
) -> None:
    # redis-py resets its client every `reinitialize_steps` MOVED answers (here each):
    # its own aclose() dropped every connection, the one a BLPOP was waiting on too.
    client: RedisCluster = GentleRedisCluster.from_url(
        "redis://" + redis_cluster.url.removeprefix("redis+cluster://"),
        decode_responses=True,
        reinitialize_steps=1,
        retry=Retry(NoBackoff(), 0),  # a command cut off fails, rather than being sent again
    )
    try:
        waiting, other = f"{prefix}list", f"{prefix}other"
        task = asyncio.create_task(client.blpop([waiting], timeout=5))
        await asyncio.sleep(0.3)  # sent; its connection is held until the answer
        owner = client.get_node_from_key(other)
        wrong = next(n for n in client.get_primaries() if n.name != owner.name)
        # Sent to the wrong primary: MOVED, a reset, and the GET again at its owner.
        assert await client.execute_command("GET", other, target_nodes=wrong) is None
        await client.rpush(waiting, "v")
        assert list(await asyncio.wait_for(task, 5)) == [waiting, "v"]
        assert await client.get(other) is None  # the client still works
    finally:
        await client.aclose()


async def test_multi_is_refused_with_what_to_do_instead(redis_cluster: LocalCluster) -> None:
    # redis-py's async cluster MULTI runs each queued command in a thread's own loop.
    client = GentleRedisCluster.from_url(
        "redis://" + redis_cluster.url.removeprefix("redis+cluster://")
    )
    try:
        with pytest.raises(NotImplementedError, match="Lua script"):
            client.pipeline(transaction=True)
    finally:
        await client.aclose()


async def test_a_node_that_lost_its_scripts_runs_only_its_own_calls_again(
    redis_cluster: LocalCluster, prefix: str
) -> None:
    """One primary lost its script cache (a failover, a restart): in a pipeline over two
    primaries, its call got NOSCRIPT and the other's ran. Before, every call was sent
    again, so the other's ran twice (a P2P message logged twice, seq 2 and 3)."""
    client: RedisCluster = GentleRedisCluster.from_url(
        "redis://" + redis_cluster.url.removeprefix("redis+cluster://"), decode_responses=True
    )
    script = Script("return redis.call('INCR', KEYS[1])")
    runner = ScriptRunner(client, [script])
    try:
        keys = [f"{prefix}k{i}" for i in range(64)]
        first, owner = keys[0], redis_cluster.primary_of(keys[0])
        other = next(k for k in keys if redis_cluster.primary_of(k) != owner)
        calls = [script.args([first]), script.args([other])]
        assert await runner.many(calls) == [1, 1]  # loaded at its first NOSCRIPT
        with redis_cluster.client(owner) as node:
            node.script_flush()
        assert await runner.many(calls) == [2, 2]
        assert [await client.get(first), await client.get(other)] == ["2", "2"]
    finally:
        await client.delete(*keys)
        await client.aclose()


async def test_a_route_key_of_another_type_is_read_as_its_user_offline_alone(
    cluster_url: str, prefix: str
) -> None:
    """The cluster's pipeline splits a look-up by node: a key of another type on one of
    them fails only its own read (its user taken as offline), not the look-up."""
    async with connect_redis(cluster_url) as client:
        registry = route_registry(client, prefix, "gw1")
        uids = [f"u{i}" for i in range(12)]  # spread over the three primaries
        for uid in uids:
            await registry.register(uid, f"gw1.c.{uid}")
        await client.delete(KeySchema(prefix).route("u5"))
        await client.set(KeySchema(prefix).route("u5"), "not a hash")
        found = await registry.lookup(uids)
        assert sorted(found) == sorted(u for u in uids if u != "u5")
        groups = await registry.lookup_groups(uids)
        assert groups.online == len(uids) - 1 and registry.unreadable == 2


async def test_a_cluster_that_does_not_serve_every_slot_is_not_answering() -> None:
    """The Redis Cluster trial: /healthz stayed 200 while `cluster_state:fail` showed
    (a master lost, its replica not yet promoted) and pushes answered 503: the PING goes
    to one node, which answers. The health check reads the cluster's state too."""
    with cluster_nodes(3) as cluster:
        async with connect_redis(cluster.url) as client:
            assert await unanswered(client, serving=True) is None
            for port in cluster.ports:  # slot 0 is nobody's now, in every node's view
                with cluster.client(port) as node:
                    node.execute_command("CLUSTER", "DELSLOTS", 0)
            for _ in range(100):
                why = await unanswered(client, serving=True)
                if why is not None:
                    break
                await asyncio.sleep(0.05)
            assert why == "the Redis Cluster's state is fail (CLUSTER INFO)", why
            assert not await ping(client)
            # A gateway starts all the same: the cluster may be mid-failover.
            assert await unanswered(client) is None
