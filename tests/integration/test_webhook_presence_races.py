"""A gateway's set of users when a close and a reconnect of the same user race on that
gateway: real Redis, the registries of two gateways, a sweeper, the clock moved by hand.

The set is what gets a crashed gateway's users their user.offline: a user connected
there but missing from it gets none if her last route elsewhere closes while the crashed
gateway's route still looks live (that close schedules nothing, and no set holds her).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence

import pytest
import redis.asyncio as aioredis

from router.redis.client import RedisClient, connect_redis
from router.routes.base import ConnectionEvents, RouteOp
from router.routes.registry import RedisRouteRegistry
from router.testing import ManualClock
from router.webhook.presence import RedisPresence
from router.webhook.sweeper import OfflineSweeper
from shared.keys import KeySchema
from shared.models import GatewayInfo
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

GRACE_S, TTL_S = 1.0, 10.0


class NoGateways:
    async def live(self) -> list[GatewayInfo]:
        return []


class HeldBack:
    """A gateway's presence whose unregisters' part waits for `go` (`held` says it is
    waiting): what a slow round trip does to a close's track."""

    def __init__(self, inner: RedisPresence) -> None:
        self.inner = inner
        self.held, self.go = asyncio.Event(), asyncio.Event()

    async def track(
        self, connected: Sequence[str], emptied: Sequence[str], *left: Sequence[str]
    ) -> None:
        if emptied or any(left):
            self.held.set()
            await self.go.wait()
        await self.inner.track(connected, emptied, *left)


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[RedisClient]:
    async with connect_redis(redis_url) as client:
        yield client


def presence_of(
    store: RedisClient, keys: KeySchema, clock: ManualClock, gid: str = ""
) -> RedisPresence:
    return RedisPresence(store, keys, clock, grace_s=GRACE_S, queue_max=1000, gateway_id=gid)


def registry_of(
    store: RedisClient,
    keys: KeySchema,
    clock: ManualClock,
    gid: str,
    presence: ConnectionEvents,
) -> RedisRouteRegistry:
    return RedisRouteRegistry(
        store, keys, clock, ttl_s=TTL_S, gateway_id=gid, group_id="g1", ip="127.0.0.1",
        port=1, presence=presence,
    )  # fmt: skip


async def offline_epochs(redis: aioredis.Redis, keys: KeySchema, uid: str) -> list[int]:
    events = [json.loads(f["e"]) for _, f in await redis.xrange(keys.webhook_events())]
    return [e["epoch"] for e in events if e["type"] == "user.offline" and e["uid"] == uid]


async def test_a_close_and_a_reconnect_in_one_batch_keep_the_user_in_the_set(
    store: RedisClient, redis: aioredis.Redis, prefix: str, clock: ManualClock
) -> None:
    keys = KeySchema(prefix)
    gw1 = registry_of(store, keys, clock, "gw1", presence_of(store, keys, clock, "gw1"))
    gw2 = registry_of(store, keys, clock, "gw2", presence_of(store, keys, clock, "gw2"))
    await gw1.apply([RouteOp(True, "u", "c1", new=True)])
    # One batch of gw1's route writer: u's close, and u back at once, on gw1 again.
    await gw1.apply([RouteOp(False, "u", "c1"), RouteOp(True, "u", "c2", new=True)])
    assert await redis.sismember(keys.gateway_users("gw1"), "u")
    # What the set is for: u connects to gw2 too (a newer epoch), gw1 crashes (c2's route
    # stays until its deadline), u leaves gw2 while that route looks live: nothing is
    # scheduled then. A sweeper finds gw1 gone and schedules what its set holds.
    clock.advance(1)
    await gw2.apply([RouteOp(True, "u", "c3", new=True)])
    epoch = int(await redis.hget(keys.presence_prefix() + "u", "e"))
    await gw2.apply([RouteOp(False, "u", "c3")])
    sweeping = presence_of(store, keys, clock)
    assert await sweeping.adopt("gw1") == 1
    sweeper = OfflineSweeper(sweeping, gw2, NoGateways(), clock, 1.0, 1.0)
    clock.advance(GRACE_S)
    assert (await sweeper.sweep()).offline == 0  # c2's route still looks live
    clock.advance(TTL_S)
    assert (await sweeper.sweep()).offline == 1
    assert await offline_epochs(redis, keys, "u") == [epoch]


@pytest.mark.parametrize("elsewhere", [False, True], ids=["alone", "also-on-gw2"])
async def test_a_reconnect_while_a_close_is_being_tracked_keeps_the_user_in_the_set(
    store: RedisClient, redis: aioredis.Redis, prefix: str, clock: ManualClock, elsewhere: bool
) -> None:
    """A close's track that is slow to run (the heartbeat's unregister of a connection
    gone meanwhile runs beside the route writer) must not take off the set a user who
    connected to the gateway again since its route was removed."""
    keys = KeySchema(prefix)
    held = HeldBack(presence_of(store, keys, clock, "gw1"))
    gw1 = registry_of(store, keys, clock, "gw1", held)
    gw2 = registry_of(store, keys, clock, "gw2", presence_of(store, keys, clock, "gw2"))
    if elsewhere:
        await gw2.apply([RouteOp(True, "u", "c0", new=True)])
    await gw1.apply([RouteOp(True, "u", "c1", new=True)])
    close = asyncio.create_task(gw1.apply([RouteOp(False, "u", "c1")]))
    await wait_for(lambda: held.held.is_set() or close.done(), "the close's route removed")
    connect = asyncio.create_task(gw1.apply([RouteOp(True, "u", "c2", new=True)]))
    await asyncio.wait({connect}, timeout=0.5)  # done by now, unless it waits for the close
    held.go.set()
    await close
    await connect
    assert await redis.sismember(keys.gateway_users("gw1"), "u")
