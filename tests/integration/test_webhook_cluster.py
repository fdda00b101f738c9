"""Presence, the offline sweeper and the outbox on a real Redis Cluster: every webhook
script keeps to the one ``{wh}`` slot, while the routes it follows spread over all."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from router.redis.client import RedisClient, connect_redis
from router.routes.base import RouteOp
from router.routes.registry import RedisRouteRegistry
from router.webhook.base import Event
from router.webhook.consumer import OutboxConsumer
from router.webhook.outbox import RedisOutbox
from router.webhook.presence import RedisPresence
from router.webhook.sweeper import OfflineSweeper
from shared.clock import SystemClock
from shared.keys import KeySchema
from shared.models import GatewayInfo

pytestmark = pytest.mark.integration


class NoGateways:
    """A fleet with no live gateway (the sweeper's `LiveFleet`)."""

    async def live(self) -> list[GatewayInfo]:
        return []


@pytest.fixture
async def cluster(cluster_url: str) -> AsyncIterator[RedisClient]:
    async with connect_redis(cluster_url) as client:
        yield client


async def test_offline_online_and_emitted_events_on_a_cluster(
    cluster: RedisClient, prefix: str
) -> None:
    keys, clock = KeySchema(prefix), SystemClock()
    presence = RedisPresence(cluster, keys, clock, grace_s=0, queue_max=1000, gateway_id="gw1")
    registry = RedisRouteRegistry(
        cluster, keys, clock, gateway_id="gw1", group_id="g1", ip="127.0.0.1", port=1,
        presence=presence,
    )  # fmt: skip
    uids = [f"user{i}" for i in range(30)]  # keys on every node
    await registry.apply([RouteOp(True, u, f"c-{u}", new=True) for u in uids])
    await registry.apply([RouteOp(False, u, f"c-{u}") for u in uids])
    sweeping = RedisPresence(cluster, keys, clock, grace_s=0, queue_max=1000)
    sweeper = OfflineSweeper(sweeping, registry, NoGateways(), clock, 0.05, 1.0)
    assert (await sweeper.sweep()).offline == 30
    await registry.apply([RouteOp(True, "user0", "c-again", new=True)])  # back: online
    await RedisOutbox(cluster, keys, 1000).emit([Event("message.unacked", "m1", 1, {"x": 1})])
    consumer = OutboxConsumer(cluster, keys, "tester", 60_000)
    await consumer.ensure_group()
    entries = await consumer.read(100)
    events = [json.loads(e.event) for e in entries]
    offline = [e for e in events if e["type"] == "user.offline"]
    assert sorted(e["uid"] for e in offline) == sorted(uids)
    (online,) = [e for e in events if e["type"] == "user.online"]
    assert online["uid"] == "user0"
    assert online["epoch"] > next(e["epoch"] for e in offline if e["uid"] == "user0")
    assert events[-1] == {"event_id": "m1", "type": "message.unacked", "ts": 1, "x": 1}
    await consumer.done(entries)
    assert await cluster.xlen(keys.webhook_events()) == 0


async def test_a_gateways_users_are_listed_again_on_a_cluster(
    cluster: RedisClient, prefix: str
) -> None:
    """What a gateway's route refresh does after each round (socket_gateway.heartbeat)."""
    keys, clock = KeySchema(prefix), SystemClock()
    presence = RedisPresence(cluster, keys, clock, grace_s=0, queue_max=1000, gateway_id="gw1")
    uids = [f"user{i}" for i in range(1500)]  # two round trips
    await presence.list_users(uids)
    assert await cluster.smembers(keys.gateway_users("gw1")) == set(uids)
    assert await cluster.smembers(keys.presence_gateways()) == {"gw1"}
