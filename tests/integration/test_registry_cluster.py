"""The registry and group multicast on a real Redis Cluster: the pipeline read path."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from router.fanout.multicast import chunked, run_multicast
from router.fanout.publisher import BatchPublisher, PushCounters
from router.redis.client import RedisClient, connect_redis
from router.routes.registry import PipelineHashReads, RedisRouteRegistry, Registration
from shared.clock import Clock, ManualClock, SystemClock
from shared.keys import KeySchema
from tests.integration.recording_bus import RecordingBus, message

pytestmark = pytest.mark.integration


@pytest.fixture
async def cluster(cluster_url: str) -> AsyncIterator[RedisClient]:
    async with connect_redis(cluster_url) as client:
        yield client


def writer(
    client: RedisClient, prefix: str, group: str, clock: Clock | None = None
) -> RedisRouteRegistry:
    return RedisRouteRegistry(
        client,
        KeySchema(prefix),
        clock or SystemClock(),
        gateway_id=f"gw-{group}",
        group_id=group,
        ip="127.0.0.1",
        port=9000,
    )


async def test_a_cluster_client_reads_through_the_pipeline(
    cluster: RedisClient, prefix: str
) -> None:
    registry = RedisRouteRegistry(cluster, KeySchema(prefix), SystemClock())
    assert isinstance(registry.reads, PipelineHashReads)


async def test_lookups_across_every_node(cluster: RedisClient, prefix: str) -> None:
    clock = ManualClock(wall_ms=SystemClock().now_ms())
    g1, g2 = writer(cluster, prefix, "g1", clock), writer(cluster, prefix, "g2", clock)
    uids = [f"user{i}" for i in range(2500)]  # keys in every node's slots
    await g1.refresh(Registration(u, f"c1-{u}") for u in uids[0::2])
    await g2.refresh(Registration(u, f"c2-{u}") for u in uids[1::3])  # some on both groups
    reader = RedisRouteRegistry(cluster, KeySchema(prefix), clock)

    found = await reader.lookup([*uids, "ghost"])
    expected = set(uids[0::2]) | set(uids[1::3])
    assert set(found) == expected
    assert {r.group_id for r in found[uids[1]]} == {"g2"}
    assert {r.group_id for r in found[uids[4]]} == {"g1", "g2"}  # a device in each group

    groups = await reader.lookup_groups([*uids, "ghost"])
    assert groups.online == len(expected)
    assert groups.by_group == {
        "g1": uids[0::2],
        "g2": uids[1::3],
    }

    clock.advance(61)  # past every route's deadline
    assert (await reader.lookup_groups(uids)).online == 0
    assert await reader.lookup(uids) == {}


async def test_route_writes_survive_every_node_losing_its_scripts(
    cluster: RedisClient, prefix: str
) -> None:
    # The upsert is one EVALSHA per key, sent through the cluster pipeline by key slot.
    gw = writer(cluster, prefix, "g1")
    uids = [f"user{i}" for i in range(300)]
    await gw.refresh(Registration(u, f"c-{u}") for u in uids[:100])
    await cluster.script_flush()  # every primary, as after a restart or failover
    await gw.refresh(Registration(u, f"c-{u}") for u in uids)
    assert set(await gw.lookup(uids)) == set(uids)


async def test_multicast_on_a_cluster(cluster: RedisClient, prefix: str) -> None:
    uids = [f"u{i:05d}" for i in range(3000)]
    for g, group in enumerate(("g1", "g2", "g3")):
        await writer(cluster, prefix, group).refresh(
            Registration(u, f"c-{u}") for i, u in enumerate(uids) if i % 3 == g
        )
    registry = RedisRouteRegistry(cluster, KeySchema(prefix), SystemClock())
    bus = RecordingBus()
    counters = PushCounters()
    publisher = BatchPublisher(bus, message(), 0, counters)
    await run_multicast(chunked([*uids, "ghost"]), registry, publisher, SystemClock())
    assert (counters.recipients, counters.online, counters.offline) == (3001, 3000, 1)
    per_group: dict[str, list[str]] = {}
    for topic, batch, _ in bus.published:
        assert topic == f"group.{batch.group_id}"
        per_group.setdefault(batch.group_id, []).extend(batch.uids)
    assert per_group == {group: uids[g::3] for g, group in enumerate(("g1", "g2", "g3"))}
