"""The route registry against a real Redis."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from router.redis.autopipe import AutoPipeline
from router.redis.client import POOL_SIZE, connect_redis
from router.routes.registry import (
    LOOKUP_CHUNK,
    BulkHashReads,
    PipelineHashReads,
    RecipientGroups,
    Registration,
    hash_reads_for,
)
from router.routes.writer import CoalescingRouteWriter
from shared.clock import ManualClock, SystemClock
from shared.errors import RegistryRefused, RegistryUnavailable
from shared.keys import KeySchema
from tests.integration.counting_pipelines import CountingPipelines
from tests.integration.stack import route_registry

pytestmark = pytest.mark.integration


async def test_register_lookup_unregister(redis: aioredis.Redis, prefix: str) -> None:
    a = route_registry(redis, prefix, "gw1")
    await a.register("alice", "gw1.x.1")
    routes = await a.lookup(["alice", "bob"])
    assert list(routes) == ["alice"]
    (route,) = routes["alice"]
    assert (route.gateway_id, route.group_id, route.port) == ("gw1", "group-of-gw1", 9001)
    await a.unregister("alice", "gw1.x.1")
    assert await a.lookup(["alice"]) == {}
    assert await redis.exists(KeySchema(prefix).route("alice")) == 0


async def test_multi_device_on_two_gateways(redis: aioredis.Redis, prefix: str) -> None:
    a, b = route_registry(redis, prefix, "gw1"), route_registry(redis, prefix, "gw2")
    await a.register("alice", "gw1.x.1")
    await a.register("alice", "gw1.x.2")
    await b.register("alice", "gw2.y.1")
    routes = (await a.lookup(["alice"]))["alice"]
    assert sorted(r.conn_id for r in routes) == ["gw1.x.1", "gw1.x.2", "gw2.y.1"]


async def test_a_stale_unregister_leaves_the_newer_route(
    redis: aioredis.Redis, prefix: str
) -> None:
    a, b = route_registry(redis, prefix, "gw1"), route_registry(redis, prefix, "gw2")
    await a.register("alice", "gw1.x.1")
    # alice reconnects on gw2 before gw1 notices the old connection is gone...
    await b.register("alice", "gw2.y.1")
    # ...then gw1's delayed disconnect arrives.
    await a.unregister("alice", "gw1.x.1")
    routes = (await b.lookup(["alice"]))["alice"]
    assert [(r.gateway_id, r.conn_id) for r in routes] == [("gw2", "gw2.y.1")]


async def test_routes_expire_by_deadline_and_key_ttl(redis: aioredis.Redis, prefix: str) -> None:
    clock = ManualClock(wall_ms=SystemClock().now_ms())
    dead = route_registry(redis, prefix, "gw1", clock, ttl_s=60)
    live = route_registry(redis, prefix, "gw2", clock, ttl_s=60)
    await dead.register("alice", "gw1.x.1")
    await live.register("alice", "gw2.y.1")
    key = KeySchema(prefix).route("alice")
    assert 0 < await redis.pttl(key) <= 60_000

    clock.advance(40)
    await live.refresh([Registration("alice", "gw2.y.1")])  # gw2 heartbeats, gw1 crashed
    clock.advance(30)
    # gw1's route passed its own deadline although gw2 keeps the key alive.
    routes = (await live.lookup(["alice"]))["alice"]
    assert [r.gateway_id for r in routes] == ["gw2"]
    # The next write drops the dead field from Redis as well.
    await live.refresh([Registration("alice", "gw2.y.1")])
    assert await redis.hkeys(key) == ["gw2.y.1"]


async def test_key_vanishes_when_nobody_refreshes(redis: aioredis.Redis, prefix: str) -> None:
    a = route_registry(redis, prefix, "gw1", ttl_s=1)
    await a.register("alice", "gw1.x.1")
    await asyncio.sleep(1.2)
    assert await redis.exists(KeySchema(prefix).route("alice")) == 0
    assert await a.lookup(["alice"]) == {}


async def test_refresh_restores_routes_after_redis_lost_them(
    redis: aioredis.Redis, prefix: str
) -> None:
    a = route_registry(redis, prefix, "gw1")
    await a.register("alice", "gw1.x.1")
    await redis.delete(KeySchema(prefix).route("alice"))  # e.g. a Redis restart without persistence
    assert await a.refresh([Registration("alice", "gw1.x.1")]) == [Registration("alice", "gw1.x.1")]
    assert "alice" in await a.lookup(["alice"])


async def test_lookup_is_one_round_trip_per_1000_users(redis: aioredis.Redis, prefix: str) -> None:
    writer = route_registry(redis, prefix, "gw1")
    uids = [f"user{i}" for i in range(2 * LOOKUP_CHUNK + 500)]
    await writer.refresh(Registration(u, f"gw1.c.{u}") for u in uids[::7])
    counting = CountingPipelines(redis)
    reader = route_registry(counting, prefix, "gw1")
    found = await reader.lookup(uids)
    assert counting.executions == 3
    assert set(found) == set(uids[::7])


async def test_bulk_lookups_are_one_request_per_1000_users(
    redis: aioredis.Redis, prefix: str
) -> None:
    writer = route_registry(redis, prefix, "gw1")
    uids = [f"user{i}" for i in range(2 * LOOKUP_CHUNK + 500)]
    await writer.refresh(Registration(u, f"gw1.c.{u}") for u in uids[::7])
    reader = route_registry(redis, prefix, "gw1")
    assert isinstance(reader.reads, BulkHashReads)
    assert set(await reader.lookup(uids)) == set(uids[::7])
    assert reader.reads.reader.round_trips == 3
    groups = await reader.lookup_groups(uids)
    assert groups == RecipientGroups(len(uids[::7]), {"group-of-gw1": uids[::7]})
    assert reader.reads.reader.round_trips == 6


def test_the_read_path_follows_the_client(redis: aioredis.Redis) -> None:
    assert isinstance(hash_reads_for(redis), BulkHashReads)
    # A cluster client routes keys to nodes; a wrapper (like CountingPipelines) is not a
    # client whose pool the bulk reader knows: both take redis-py's pipeline.
    cluster = RedisCluster(host="127.0.0.1", port=1)  # never connected
    assert isinstance(hash_reads_for(cluster), PipelineHashReads)
    assert isinstance(hash_reads_for(CountingPipelines(redis)), PipelineHashReads)


@pytest.mark.parametrize("pipeline", [False, True], ids=["bulk", "pipeline"])
async def test_group_lookup_counts_live_devices_once_per_group(
    redis: aioredis.Redis, prefix: str, pipeline: bool
) -> None:
    clock = ManualClock(wall_ms=SystemClock().now_ms())
    g1a = route_registry(redis, prefix, "gw1", clock, group_id="g1")
    g1b = route_registry(redis, prefix, "gw2", clock, group_id="g1")
    g2 = route_registry(redis, prefix, "gw3", clock, group_id="g2", ttl_s=10)
    await g1a.register("alice", "a1")
    await g1b.register("alice", "a2")  # a second device, same group
    await g2.register("alice", "a3")
    await g2.register("bob", "b1")
    await g1a.register("carol", "c1")
    await g2.register("carol", "c2")
    reader = route_registry(
        redis, prefix, "gw1", clock, reads=PipelineHashReads(redis) if pipeline else None
    )
    uids = ["alice", "bob", "carol", "dave"]
    assert await reader.lookup_groups(uids) == RecipientGroups(
        3, {"g1": ["alice", "carol"], "g2": ["alice", "bob", "carol"]}
    )
    clock.advance(11)  # g2's routes passed their deadline; the keys are still there
    assert await reader.lookup_groups(uids) == RecipientGroups(2, {"g1": ["alice", "carol"]})
    assert set(await reader.lookup(uids)) == {"alice", "carol"}


async def test_lookups_on_a_dead_redis_raise_registry_unavailable(prefix: str) -> None:
    async with connect_redis("redis://127.0.0.1:1/0") as dead:
        registry = route_registry(dead, prefix, "gw1")
        assert isinstance(registry.reads, BulkHashReads)
        with pytest.raises(RegistryUnavailable):
            await registry.lookup_groups(["a", "b"])
        with pytest.raises(RegistryUnavailable):
            await registry.lookup(["a"])


async def test_concurrent_writes_coalesce_into_few_round_trips(
    redis: aioredis.Redis, prefix: str
) -> None:
    counting = CountingPipelines(redis)
    writer = CoalescingRouteWriter(route_registry(counting, prefix, "gw1"))
    uids = [f"u{i}" for i in range(2500)]
    await asyncio.gather(*(writer.register(u, f"gw1.c.{u}") for u in uids))
    # The first write goes alone; everything queued behind it shares pipelines of 1000.
    assert counting.executions <= 5
    found = await route_registry(redis, prefix, "gw1").lookup(uids)
    assert set(found) == set(uids)
    # A register and an unregister of one connection, queued together, keep their order.
    await asyncio.gather(
        writer.register("late", "gw1.c.late"), writer.unregister("late", "gw1.c.late")
    )
    await asyncio.gather(*(writer.unregister(u, f"gw1.c.{u}") for u in uids))
    await writer.aclose()
    assert await route_registry(redis, prefix, "gw1").lookup([*uids, "late"]) == {}


async def test_writer_reports_redis_failures_to_every_waiter(prefix: str) -> None:
    async with connect_redis("redis://127.0.0.1:1/0") as dead:
        writer = CoalescingRouteWriter(route_registry(dead, prefix, "gw1"))
        results = await asyncio.gather(
            *(writer.register(f"u{i}", f"c{i}") for i in range(5)), return_exceptions=True
        )
        assert all(isinstance(r, RegistryUnavailable) for r in results)
        await writer.aclose()


async def test_one_key_of_another_type_fails_only_its_own_write(
    redis: aioredis.Redis, prefix: str
) -> None:
    """A user's route key holding a string (another app's, a hand edit) makes Redis
    refuse that user's call: only its waiter hears of it, in a coalesced batch and in a
    chunk of many unregisters; the others are written (and tracked)."""
    keys = KeySchema(prefix)
    registry = route_registry(redis, prefix, "gw1")
    writer = CoalescingRouteWriter(registry)
    uids = [f"u{i}" for i in range(6)]
    await redis.set(keys.route("u3"), "not a hash")
    await writer.register("first", "gw1.c.first")  # the next ones queue behind it
    results = await asyncio.gather(
        *(writer.register(u, f"gw1.c.{u}") for u in uids), return_exceptions=True
    )
    assert [isinstance(r, RegistryRefused) for r in results] == [u == "u3" for u in uids]
    others = [u for u in uids if u != "u3"]
    assert set(await registry.lookup(others)) == set(others)
    await redis.delete(keys.route("u3"))
    await writer.register("u3", "gw1.c.u3")
    await redis.delete(keys.route("u1"))
    await redis.set(keys.route("u1"), "not a hash")
    with pytest.raises(RegistryUnavailable, match="1 of 6 routes not removed"):
        await registry.unregister_many(Registration(u, f"gw1.c.{u}") for u in uids)
    assert await registry.lookup([u for u in uids if u != "u1"]) == {}
    await writer.aclose()


@pytest.mark.parametrize("reads", ["bulk", "pipeline", "auto"])
async def test_a_route_key_of_another_type_is_read_as_its_user_offline_alone(
    redis: aioredis.Redis, prefix: str, reads: str
) -> None:
    """A route key holding a string (another app's, a hand edit) makes Redis refuse that
    one read: a look-up that includes it finds the others and takes its user as
    offline, and counts it; on each way of reading (one key goes by the auto-pipeline)."""
    registry = route_registry(redis, prefix, "gw1")
    for uid in ("alice", "carol"):
        await registry.register(uid, f"gw1.c.{uid}")
    await redis.set(KeySchema(prefix).route("bob"), "not a hash")
    auto = AutoPipeline(redis) if reads == "auto" else None
    way = PipelineHashReads(redis) if reads == "pipeline" else BulkHashReads(redis, auto)
    reader = route_registry(redis, prefix, "gw1", reads=way)
    uids = ["alice", "bob", "carol"]
    assert set(await reader.lookup(uids)) == {"alice", "carol"}
    assert await reader.lookup(["bob"]) == {}
    assert set(await reader.lookup(["alice"])) == {"alice"}
    assert await reader.lookup_groups(uids) == RecipientGroups(
        2, {"group-of-gw1": ["alice", "carol"]}
    )
    assert reader.unreadable == 3


@pytest.mark.parametrize("reads", ["bulk", "pipeline", "auto"])
async def test_a_refusal_not_of_the_keys_type_fails_the_look_up_whole(
    redis: aioredis.Redis, redis_url: str, prefix: str, reads: str
) -> None:
    """Only a key of another type is its user's alone: an error reply of any other kind
    (here an ACL's NOPERM on one user's key) must not pass for that user being offline."""
    registry = route_registry(redis, prefix, "gw1")
    for uid in ("alice", "bob"):
        await registry.register(uid, f"gw1.c.{uid}")
    user = f"imroute-test-{prefix.strip(':').replace(':', '-')}"
    allowed = KeySchema(prefix).route("alice")
    await redis.execute_command("ACL", "SETUSER", user, "on", ">pw", f"~{allowed}", "+@all")
    try:
        limited = aioredis.Redis.from_url(
            redis_url, username=user, password="pw", decode_responses=True
        )
        auto = AutoPipeline(limited) if reads == "auto" else None
        way = PipelineHashReads(limited) if reads == "pipeline" else BulkHashReads(limited, auto)
        reader = route_registry(limited, prefix, "gw1", reads=way)
        assert set(await reader.lookup(["alice"])) == {"alice"}
        with pytest.raises(RegistryUnavailable, match="no permissions"):
            await reader.lookup(["bob"] if reads == "auto" else ["alice", "bob"])
        assert reader.unreadable == 0
        await limited.aclose()
    finally:
        await redis.execute_command("ACL", "DELUSER", user)


async def test_a_burst_of_callers_waits_for_pool_connections(redis_url: str, prefix: str) -> None:
    async with connect_redis(redis_url) as client:
        registry = route_registry(client, prefix, "gw1")
        # More concurrent callers than the pool has connections: they queue, none fail.
        results = await asyncio.gather(*(registry.lookup([f"u{i}"]) for i in range(POOL_SIZE * 4)))
        assert results == [{}] * (POOL_SIZE * 4)


async def test_writes_survive_redis_losing_its_script_cache(
    redis: aioredis.Redis, prefix: str
) -> None:
    a = route_registry(redis, prefix, "gw1")
    await a.register("alice", "gw1.x.1")
    await redis.script_flush()  # what a Redis restart or failover does
    await a.register("bob", "gw1.x.2")
    assert set(await a.lookup(["alice", "bob"])) == {"alice", "bob"}


@pytest.mark.usefixtures("redis")
async def test_a_cancelled_loop_of_lookups_stops(prefix: str, redis_url: str) -> None:
    # redis-py can swallow a cancellation that lands mid-command; ours must not.
    async with connect_redis(redis_url) as client:
        registry = route_registry(client, prefix, "gw1")

        async def forever() -> None:
            while True:
                await registry.lookup(["a", "b"])

        for delay in (0.005, 0.01, 0.013, 0.02, 0.031, 0.05):
            task = asyncio.create_task(forever())
            await asyncio.sleep(delay)
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=2)
            assert done, f"the loop ignored its cancellation (after {delay}s)"
            assert task.cancelled()
