"""Broadcast and multicast end to end over Google Cloud Pub/Sub (the official emulator):
REST -> job -> Pub/Sub -> gateways -> WebSocket clients. Skipped, with the reason in the
summary, where the emulator is not installed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest

from shared.errors import ConfigError
from socket_gateway.app import Gateway
from tests.integration.group_pushes import GATEWAYS, connect_all, finished, frames
from tests.integration.stack import AUTH, api, gateway
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def bus_url(pubsub_project: str) -> str:
    return f"pubsub://{pubsub_project}"


@asynccontextmanager
async def fleet(redis_url: str, prefix: str, bus_url: str) -> AsyncIterator[list[Gateway]]:
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(gateway(redis_url, prefix, gid, group, bus_url=bus_url))
            for gid, group in GATEWAYS
        ]


async def wait_batches(gw: Gateway, n: int, timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while gw.deliver_service.batches < n:
        assert asyncio.get_running_loop().time() < deadline, gw.deliver_service.batches
        await asyncio.sleep(0.05)


@pytest.mark.usefixtures("redis")
async def test_broadcast_and_multicast_over_pubsub(
    redis_url: str, prefix: str, bus_url: str
) -> None:
    users = [{"uid": f"u{i:04d}", "tags": ["vip"] if i % 10 == 0 else []} for i in range(2500)]
    online = [u["uid"] for u in users[::25]]  # 100, spread over 2 groups x 2 gateways
    async with (
        fleet(redis_url, prefix, bus_url) as gws,
        api(redis_url, prefix, bus_url=bus_url) as http,
    ):
        put = await http.put("/v1/users", json={"users": users}, headers=AUTH)
        assert put.json() == {"upserted": 2500}
        async with AsyncExitStack() as stack:
            sockets = await connect_all(stack, gws, online)

            # Broadcast: 3 directory pages, each one Pub/Sub message every gateway gets.
            resp = await http.post("/v1/broadcast", json={"content": "b"}, headers=AUTH)
            assert resp.status_code == 202
            push_id = resp.json()["push_id"]
            job = await finished(http, push_id)
            assert (job["status"], job["batches"], job["published"]) == ("done", 3, 3)
            for gw in gws:
                await wait_batches(gw, 3, timeout=10)
            got = await frames(sockets)
            assert all([f["push_id"] for f in fs] == [push_id] for fs in got.values())

            # tags_any: only the tagged users.
            resp = await http.post(
                "/v1/broadcast",
                json={"content": "vip", "audience": {"tags_any": ["vip"]}},
                headers=AUTH,
            )
            job = await finished(http, resp.json()["push_id"])
            assert job["recipients"] == 250
            for gw in gws:
                await wait_batches(gw, 4, timeout=10)
            got = await frames(sockets)
            vip = {u["uid"] for u in users if u["tags"]}
            assert {uid for uid, fs in got.items() if fs} == vip & set(online)

            # Multicast: one batch per group on its own topic; offline uids counted.
            resp = await http.post(
                "/v1/multicast",
                json={"to": [u["uid"] for u in users] + ["ghost"], "content": "m"},
                headers=AUTH,
            )
            job = await finished(http, resp.json()["push_id"])
            assert (job["online"], job["offline"], job["batches"]) == (100, 2401, 2)
            for gw in gws:
                await wait_batches(gw, 5, timeout=10)
            got = await frames(sockets)
            assert all([f["content"] for f in fs] == ["m"] for fs in got.values())
            # And the 3 offline-log entries every gateway follows (read from Redis as the
            # log's head moves, within about a second).
            for g in gws:
                await wait_batches(g, 8, timeout=5)
            assert [g.deliver_service.batches for g in gws] == [8, 8, 8, 8]


@pytest.mark.usefixtures("redis")
async def test_a_backlog_on_pubsub_from_before_a_restart_is_acked_not_written(
    redis_url: str, prefix: str, bus_url: str
) -> None:
    async with api(redis_url, prefix, bus_url=bus_url) as http:
        async with gateway(redis_url, prefix, "gw1", "g1", bus_url=bus_url):
            pass  # its subscriptions exist from here on
        resp = await http.post(
            "/v1/broadcast", json={"content": 1, "audience": {"online": True}}, headers=AUTH
        )
        await finished(http, resp.json()["push_id"])
        async with gateway(redis_url, prefix, "gw1", "g1", bus_url=bus_url) as gw:
            # At once on Pub/Sub; the emulator may first hand it to the stream that
            # stopped, and only then (10-20 s) to this one. It is from before this
            # gateway started: acked, not written (its clients replay it themselves).
            assert gw.follower is not None
            sequencer = gw.follower.sequencers["broadcast"]
            await wait_for(lambda: sequencer.late, "the late batch", 35.0, every=0.1)
            assert sequencer.late == 1 and gw.deliver_service.batches == 0
            await asyncio.sleep(0.5)  # the ack reaches Pub/Sub
        async with gateway(redis_url, prefix, "gw1", "g1", bus_url=bus_url) as gw:
            await asyncio.sleep(1.0)
            assert gw.follower is not None
            assert gw.follower.sequencers["broadcast"].late == 0  # acked: not again


async def test_a_bad_pubsub_url_stops_the_push_service_at_start(
    redis_url: str, prefix: str
) -> None:
    with pytest.raises(ConfigError, match="IMROUTE_BUS_URL") as info:
        async with api(redis_url, prefix, bus_url="pubsub://Not_A_Project"):
            pass
    assert "project id" in str(info.value)
