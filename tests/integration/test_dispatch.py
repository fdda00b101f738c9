"""GET /v1/dispatch against real gateways and Redis, and a full gateway refusing clients."""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import connect

from router.fleet.cache import CachedFleet
from router.fleet.dispatch import Dispatcher
from router.fleet.store import RedisGatewayFleet
from shared.clock import SystemClock
from shared.keys import KeySchema
from shared.models import GatewayInfo
from socket_gateway.app import Gateway
from tests.integration.stack import api, client, gateway, handshake_refused, token
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

FOUR = [("gw1", "g1"), ("gw2", "g1"), ("gw3", "g2"), ("gw4", "g2")]


@asynccontextmanager
async def fleet(
    redis_url: str, prefix: str, gateways: list[tuple[str, str]] = FOUR, **kw: Any
) -> AsyncIterator[list[Gateway]]:
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(gateway(redis_url, prefix, gid, group, **kw))
            for gid, group in gateways
        ]


async def dispatch(http: httpx.AsyncClient, uid: str, **params: str) -> httpx.Response:
    return await http.get(
        "/v1/dispatch", params=params, headers={"Authorization": f"Bearer {token(uid)}"}
    )


@pytest.mark.usefixtures("redis")
async def test_round_robin_spreads_1200_dispatches_within_one(redis_url: str, prefix: str) -> None:
    async with (
        fleet(redis_url, prefix) as gws,
        api(redis_url, prefix, dispatch_rule="round_robin") as http,
    ):
        counts: collections.Counter[str] = collections.Counter()
        for i in range(1200):
            resp = await dispatch(http, f"u{i}")
            assert resp.status_code == 200, resp.text
            body = resp.json()
            counts[body["gateway_id"]] += 1
        assert set(counts) == {g.settings.gateway_id for g in gws}
        assert max(counts.values()) - min(counts.values()) <= 1
        # The answer is where the client can really connect.
        by_id = {g.settings.gateway_id: g for g in gws}
        chosen = (await dispatch(http, "alice")).json()
        assert chosen["ws_url"] == f"ws://127.0.0.1:{by_id[chosen['gateway_id']].ws_port}/ws"
        assert chosen["group_id"] == by_id[chosen["gateway_id"]].settings.group_id
        async with connect(f"{chosen['ws_url']}?token={token('alice')}") as ws:
            await wait_for(
                lambda: any(c.uid == "alice" for c in by_id[chosen["gateway_id"]].conns),
                "alice on the dispatched gateway",
            )
            await ws.close()


@pytest.mark.usefixtures("redis")
async def test_consistent_hash_keeps_each_user_in_one_group(redis_url: str, prefix: str) -> None:
    async with fleet(redis_url, prefix), api(redis_url, prefix) as http:  # the default rule
        groups: dict[str, set[str]] = collections.defaultdict(set)
        for _ in range(3):
            for i in range(200):
                groups[f"user{i}"].add((await dispatch(http, f"user{i}")).json()["group_id"])
        assert all(len(g) == 1 for g in groups.values())
        spread = collections.Counter(next(iter(g)) for g in groups.values())
        assert set(spread) == {"g1", "g2"} and min(spread.values()) > 60  # both groups used


async def test_stale_draining_and_full_gateways_are_never_chosen(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    keys, clock = KeySchema(prefix), SystemClock()
    records = RedisGatewayFleet(redis, keys, clock, ttl_s=30)  # type: ignore[arg-type]
    now = clock.now_ms()

    def info(gid: str, **kw: Any) -> GatewayInfo:
        base: dict[str, Any] = {
            "gateway_id": gid, "group_id": "g9", "ws_url": f"ws://{gid}/ws",
            "grpc_address": "127.0.0.1:1", "connections": 0, "started_ms": now,
            "max_connections": 100,
        }  # fmt: skip
        base.update(kw)
        return GatewayInfo(**base)

    await records.announce(info("draining", draining=True))
    await records.announce(info("full", connections=100))
    await records.announce(info("stale"))
    # Its heartbeat lapsed a moment ago: the index says so, though the record remains.
    await redis.zadd(keys.gateways(), {"stale": now - 1})
    async with (
        fleet(redis_url, prefix, [("ok", "g1")]),
        api(redis_url, prefix, dispatch_rule="round_robin") as http,
    ):
        chosen = {(await dispatch(http, f"u{i}")).json()["gateway_id"] for i in range(50)}
        assert chosen == {"ok"}
        await redis.delete(keys.gateway("ok"))
        await redis.zrem(keys.gateways(), "ok")
        resp = await dispatch(http, "u1")
        assert resp.status_code == 503
        assert resp.headers["Retry-After"] == "1"  # IMROUTE_GATEWAY_CACHE_S is 0 here
        assert "draining or full" in resp.json()["detail"]


@pytest.mark.usefixtures("redis")
async def test_placements_count_before_the_next_heartbeat(redis_url: str, prefix: str) -> None:
    # Two gateways that take 3 clients each: the seventh client finds no room, although
    # no heartbeat has reported a single connection yet.
    async with (
        fleet(redis_url, prefix, [("a", "g1"), ("b", "g1")], gateway_max_connections=3),
        api(redis_url, prefix, dispatch_rule="least_connections", gateway_cache_s=30) as http,
    ):
        chosen = [(await dispatch(http, f"u{i}")).json()["gateway_id"] for i in range(6)]
        assert sorted(chosen) == ["a", "a", "a", "b", "b", "b"]
        assert (await dispatch(http, "u7")).status_code == 503


@pytest.mark.usefixtures("redis")
async def test_dispatch_needs_a_valid_client_token(redis_url: str, prefix: str) -> None:
    async with fleet(redis_url, prefix, [("a", "g1")]), api(redis_url, prefix) as http:
        assert (await http.get("/v1/dispatch")).status_code == 401
        resp = await http.get("/v1/dispatch", headers={"Authorization": "Bearer nope"})
        assert resp.status_code == 401
        assert resp.json()["error"] == "unauthorized"
        assert (await dispatch(http, "a", zone="")).status_code == 422


async def test_a_bad_dispatch_rule_stops_the_push_service(redis_url: str, prefix: str) -> None:
    from push_service.app import create_app
    from shared.errors import ConfigError
    from tests.integration.stack import settings

    with pytest.raises(ConfigError, match="IMROUTE_DISPATCH_RULE") as info:
        create_app(settings(redis_url, prefix, dispatch_rule="random"))
    assert "consistent_hash" in str(info.value)


async def test_a_full_gateway_refuses_with_503_and_keeps_its_clients(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    async with gateway(redis_url, prefix, "gw1", "g1", gateway_max_connections=2) as gw:
        async with client(gw, "a"), client(gw, "b"):
            response = await handshake_refused(f"ws://127.0.0.1:{gw.ws_port}/ws?token={token('c')}")
            assert response.status_code == 503 and response.headers["Retry-After"]
            assert "gateway full" in json.loads(response.body)["detail"]
            assert sorted(c.uid for c in gw.conns) == ["a", "b"]
            assert await redis.exists(KeySchema(prefix).route("c")) == 0
            assert gw.info.max_connections == 2


async def test_a_fifth_group_in_the_redis_fleet_moves_15_to_25_percent_of_10000_users(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    """The dispatcher over fleet records in Redis (in process: 2 x 10,000 choices through
    HTTP would take most of a minute): adding a group moves about a fifth of the users,
    and only to the new group."""
    keys, clock = KeySchema(prefix), SystemClock()
    records = RedisGatewayFleet(redis, keys, clock, ttl_s=30)  # type: ignore[arg-type]
    cached = CachedFleet(records, clock, max_age_s=3600)  # read again when told
    dispatcher = Dispatcher(cached, clock, "consistent_hash")
    uids = [f"member-{i}" for i in range(10_000)]

    async def announce(gid: str, group: str) -> None:
        await records.announce(
            GatewayInfo(gid, group, f"ws://{gid}/ws", f"{gid}:1", 0, clock.now_ms())
        )

    for n in range(1, 5):
        await announce(f"gw{n}", f"g{n}")
    # One fleet read serves every choice: the placements it counts spread each group's
    # users over its gateways, which does not change the groups.
    snapshot = await cached.live()
    assert len(snapshot) == 4
    before = {uid: (await dispatcher.choose(uid)).group_id for uid in uids}
    await announce("gw5", "g5")
    cached.invalidate()
    after = {uid: (await dispatcher.choose(uid)).group_id for uid in uids}
    moved = [uid for uid in uids if before[uid] != after[uid]]
    assert 0.15 <= len(moved) / len(uids) <= 0.25, len(moved)
    assert {after[uid] for uid in moved} == {"g5"}
    assert set(before.values()) == {"g1", "g2", "g3", "g4"}


@pytest.mark.usefixtures("redis")
async def test_avoid_sends_a_client_to_another_gateway_of_its_group(
    redis_url: str, prefix: str
) -> None:
    # The fleet-wide learning off: the many reports below would otherwise take a
    # gateway out for everyone as soon as they reach Redis (a race with this loop;
    # test_reports_from_enough_users_take_a_gateway_out_for_everyone is about that).
    async with (
        fleet(redis_url, prefix),
        api(redis_url, prefix, dispatch_skip_min_failures=0) as http,
    ):
        # Users of g1 only, each asking without, then with avoid=<where it was sent>.
        for i in range(60):
            plain = (await dispatch(http, f"u{i}")).json()
            if plain["group_id"] != "g1":
                continue
            other = ({"gw1", "gw2"} - {plain["gateway_id"]}).pop()
            for params in ({"avoid": plain["gateway_id"]}, {"avoid": f"gw9,{plain['gateway_id']}"}):
                moved = await dispatch(http, f"u{i}", **params)
                assert moved.status_code == 200, moved.text
                assert moved.json()["gateway_id"] == other  # same group, the other gateway
        # Both of g1 avoided (repeated): the user goes to g2; all four: one of them anyway.
        resp = await http.get(
            "/v1/dispatch",
            params=[("avoid", "gw1"), ("avoid", "gw2")],
            headers={"Authorization": f"Bearer {token('u1')}"},
        )
        assert resp.json()["group_id"] == "g2"
        resp = await dispatch(http, "u1", avoid="gw1,gw2,gw3,gw4")
        assert resp.status_code == 200 and resp.json()["gateway_id"] in {"gw1", "gw2", "gw3", "gw4"}


@pytest.mark.usefixtures("redis")
async def test_a_malformed_avoid_is_a_422_naming_it(redis_url: str, prefix: str) -> None:
    async with fleet(redis_url, prefix, [("a", "g1")]), api(redis_url, prefix) as http:
        for bad in ("", "a,,b", "gw 1", "x" * 65, ",".join(f"g{i}" for i in range(9))):
            resp = await dispatch(http, "u", avoid=bad)
            assert resp.status_code == 422, (bad, resp.text)
            body = resp.json()
            assert body["error"] == "invalid_request"
            assert body["detail"][0]["field"] == "avoid", body
        assert "at most 8" in (await dispatch(http, "u", avoid="1,2,3,4,5,6,7,8,9")).text
        # A well-formed id that is not in the fleet is ignored.
        assert (await dispatch(http, "u", avoid="gone")).json()["gateway_id"] == "a"
        # A bad token is still a 401 first.
        resp = await http.get(
            "/v1/dispatch", params={"avoid": "gw 1"}, headers={"Authorization": "Bearer no"}
        )
        assert resp.status_code == 401


@pytest.mark.usefixtures("redis")
async def test_reports_from_enough_users_take_a_gateway_out_for_everyone(
    redis_url: str, prefix: str
) -> None:
    """Through the fleet's counts in real Redis: a push service's reports reach the
    counts with its stats sampler (every second), and the dispatcher reads them back."""
    async with (
        fleet(redis_url, prefix, [("gw1", "g1"), ("gw2", "g1")]),
        api(
            redis_url,
            prefix,
            dispatch_rule="least_connections",
            dispatch_skip_min_failures=3,
            dispatch_skip_window_s=4,
        ) as http,
    ):
        # Nobody is connected: ties go to the smallest id.
        assert (await dispatch(http, "fresh")).json()["gateway_id"] == "gw1"
        for i in range(3):
            assert (await dispatch(http, f"cut{i}", avoid="gw1")).json()["gateway_id"] == "gw2"

        async def fresh_goes_to(gateway_id: str) -> bool:
            return bool((await dispatch(http, "fresh")).json()["gateway_id"] == gateway_id)

        loop = asyncio.get_running_loop()
        start = loop.time()
        while not await fresh_goes_to("gw2"):
            assert loop.time() - start < 5, "gw1 still chosen after 3 users reported it"
            await asyncio.sleep(0.1)
        assert all([await fresh_goes_to("gw2") for _ in range(20)])
        # The reports stop: after the window, gw1 is chosen again.
        while not await fresh_goes_to("gw1"):
            assert loop.time() - start < 12, "gw1 still skipped long after the window"
            await asyncio.sleep(0.2)
        assert loop.time() - start > 3


async def test_a_gateway_on_another_kind_of_bus_is_warned_of_once(
    redis_url: str, prefix: str, pubsub_project: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: a gateway on Redis Streams beside push services on Pub/Sub (the shipped
    docker-compose.yml did this) heard none of their batches, and nothing said so."""
    async with (
        gateway(redis_url, prefix, "gw1", "g1") as same,
        gateway(redis_url, prefix, "gw2", "g2", bus_url=f"pubsub://{pubsub_project}") as other,
        api(redis_url, prefix, gateway_cache_s=0) as http,
    ):
        assert (same.info.bus, other.info.bus) == ("redis", "pubsub")
        with caplog.at_level(logging.WARNING, logger="push_service.wiring"):
            for uid in ("amy", "bob", "cid"):  # each dispatch reads the fleet
                headers = {"Authorization": f"Bearer {token(uid)}"}
                assert (await http.get("/v1/dispatch", headers=headers)).status_code == 200
    said = [r.getMessage() for r in caplog.records if r.name == "push_service.wiring"]
    assert said == [
        "gateway gw2 hears batches on a pubsub bus, this push service publishes them on a "
        "redis bus: it gets broadcasts and group pushes only from the topic logs, late, "
        "or not at all; give every process the same IMROUTE_BUS_URL (docs/operations/bus.md)"
    ]
