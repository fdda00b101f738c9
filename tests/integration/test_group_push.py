"""Broadcast and multicast end to end: REST -> job -> Redis Streams bus -> gateways -> clients."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
import redis.asyncio as aioredis

from router.bus import RedisStreamsBus
from shared.keys import KeySchema
from socket_gateway.app import Gateway
from socket_gateway.bus_consumer import gateway_topics
from tests.integration.group_pushes import GATEWAYS, connect_all, finished, frames
from tests.integration.stack import AUTH, api, gateway
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]


@asynccontextmanager
async def fleet(redis_url: str, prefix: str) -> AsyncIterator[list[Gateway]]:
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(gateway(redis_url, prefix, gid, group))
            for gid, group in GATEWAYS
        ]


async def test_broadcast_reaches_each_connected_directory_user_once(
    redis_url: str, prefix: str
) -> None:
    users = [{"uid": f"u{i:05d}", "tags": ["vip"] if i % 10 == 0 else []} for i in range(5000)]
    online = [u["uid"] for u in users[::17]][:300]
    strangers = [f"stranger{i}" for i in range(10)]  # connected, but not in the directory
    async with fleet(redis_url, prefix) as gws, api(redis_url, prefix) as http:
        put = await http.put("/v1/users", json={"users": users}, headers=AUTH)
        assert put.status_code == 200 and put.json() == {"upserted": 5000}
        async with AsyncExitStack() as stack:
            sockets = await connect_all(stack, gws, [*online, *strangers])

            resp = await http.post("/v1/broadcast", json={"content": {"n": 1}}, headers=AUTH)
            assert resp.status_code == 202
            push_id = resp.json()["push_id"]
            job = await finished(http, push_id)
            assert job["status"] == "done" and job["error"] is None
            assert (job["recipients"], job["batches"], job["published"]) == (5000, 5, 5)
            got = await frames(sockets)
            for uid in online:
                assert [f["push_id"] for f in got[uid]] == [push_id], uid
            assert all(got[s] == [] for s in strangers)
            msg_ids = {got[uid][0]["msg_id"] for uid in online}
            assert len(msg_ids) == 1  # one message, the same ids for every recipient
            # Each gateway received the five batches once and wrote only to its own users.
            assert [g.deliver_service.batches for g in gws] == [5, 5, 5, 5]

            # tags_any reaches exactly the tagged users.
            resp = await http.post(
                "/v1/broadcast",
                json={"content": 2, "audience": {"tags_any": ["vip"]}},
                headers=AUTH,
            )
            job = await finished(http, resp.json()["push_id"])
            assert job["recipients"] == 500 and job["batches"] == 1
            got = await frames(sockets)
            vip = {u["uid"] for u in users if u["tags"]}
            assert {uid for uid, fs in got.items() if fs} == vip & set(online)

            # online: every local connection, directory or not, without reading it.
            resp = await http.post(
                "/v1/broadcast", json={"content": 3, "audience": {"online": True}}, headers=AUTH
            )
            job = await finished(http, resp.json()["push_id"])
            assert (job["recipients"], job["batches"]) == (0, 1)
            got = await frames(sockets)
            assert all([f["content"] for f in fs] == [3] for fs in got.values())


async def test_multicast_batches_per_group_and_counts_offline(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    recipients = [f"m{i:05d}" for i in range(2500)]
    online = recipients[::10]  # 250 connected, spread over both groups
    keys = KeySchema(prefix)
    async with fleet(redis_url, prefix) as gws, api(redis_url, prefix) as http:
        async with AsyncExitStack() as stack:
            sockets = await connect_all(stack, gws, online)
            resp = await http.post(
                "/v1/multicast",
                json={"to": [*recipients, "ghost"], "content": "hi"},
                headers=AUTH,
            )
            assert resp.status_code == 202
            job = await finished(http, resp.json()["push_id"])
            assert job["status"] == "done"
            assert (job["recipients"], job["online"], job["offline"]) == (2501, 250, 2251)
            got = await frames(sockets)
            assert all(len(fs) == 1 for fs in got.values())
            # One batch per group (125 online in each): ⌈125/1000⌉, on its own topic.
            assert await redis.xlen(keys.bus_stream("group.g1")) == 1
            assert await redis.xlen(keys.bus_stream("group.g2")) == 1
            # One group batch each, and the 3 offline-log entries (a chunk's recipients
            # without a route) that every gateway follows, read as the log's head moves.
            for _ in range(50):
                if all(g.deliver_service.batches >= 4 for g in gws):
                    break
                await asyncio.sleep(0.1)
            assert [g.deliver_service.batches for g in gws] == [4, 4, 4, 4]

            # High priority never waits for a buffer: each chunk of 1000 resolved
            # recipients leaves at once, so each group gets a batch per chunk.
            resp = await http.post(
                "/v1/multicast",
                json={"to": [*recipients, "ghost"], "content": "now", "priority": "high"},
                headers=AUTH,
            )
            job = await finished(http, resp.json()["push_id"])
            assert job["batches"] == 6  # 3 chunks x 2 groups
            got = await frames(sockets)
            assert all([f["content"] for f in fs] == ["now"] for fs in got.values())


async def test_a_small_multicast_leaves_at_the_end_of_its_input(
    redis_url: str, prefix: str
) -> None:
    async with fleet(redis_url, prefix) as gws, api(redis_url, prefix, flush_timeout_s=0.2) as http:
        async with AsyncExitStack() as stack:
            sockets = await connect_all(stack, gws, ["a", "b"])
            resp = await http.post(
                "/v1/multicast", json={"to": ["a", "b"], "content": 1}, headers=AUTH
            )
            await finished(http, resp.json()["push_id"])
            got = await frames(sockets)
            assert [len(got["a"]), len(got["b"])] == [1, 1]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/multicast", {"to": [], "content": 1}, "body.to"),
        ("/v1/multicast", {"content": 1}, "body"),
        ("/v1/multicast", {"to": ["a"], "audience": {"tags_any": ["x"]}, "content": 1}, "body"),
        ("/v1/multicast", {"audience": {"online": True}, "content": 1}, "body"),
        ("/v1/broadcast", {"content": 1, "audience": {"nope": 1}}, "body.audience.nope"),
        ("/v1/broadcast", {"content": 1, "audience": {}}, "body.audience"),
        ("/v1/broadcast", {"content": 1, "audience": {"online": False}}, "body.audience"),
        ("/v1/broadcast", {"content": 1, "priority": "urgent"}, "body.priority"),
        ("/v1/broadcast", {"content": 1, "ttl_s": 0}, "body.ttl_s"),
        ("/v1/users", {"users": []}, "body.users"),
        ("/v1/users", {"users": [{"uid": "a", "tags": ["x" * 65]}]}, "body.users.0.tags.0"),
    ],
)
async def test_bad_group_pushes_are_422_and_publish_nothing(
    redis_url: str, prefix: str, redis: aioredis.Redis, path: str, body: dict[str, Any], field: str
) -> None:
    async with api(redis_url, prefix) as http:
        method = http.put if path == "/v1/users" else http.post
        resp = await method(path, json=body, headers=AUTH)
        assert resp.status_code == 422, resp.text
        fields = [d["field"] for d in resp.json()["detail"]]
        assert any(f.startswith(field) for f in fields), fields
    assert [k async for k in redis.scan_iter(match=f"{prefix}bus:*")] == []


async def test_more_than_a_million_recipients_is_refused(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    async with api(redis_url, prefix) as http:
        to = [f"{i}" for i in range(1_000_001)]
        resp = await http.post("/v1/multicast", json={"to": to, "content": 1}, headers=AUTH)
        assert resp.status_code == 422
        assert resp.json()["detail"][0]["field"] == "body.to"
    assert [k async for k in redis.scan_iter(match=f"{prefix}bus:*")] == []


async def test_unknown_push_and_user_are_404(redis_url: str, prefix: str) -> None:
    async with api(redis_url, prefix) as http:
        assert (await http.get("/v1/pushes/nope", headers=AUTH)).status_code == 404
        assert (await http.delete("/v1/users/nobody", headers=AUTH)).status_code == 404
        await http.put("/v1/users", json={"users": [{"uid": "x"}]}, headers=AUTH)
        assert (await http.delete("/v1/users/x", headers=AUTH)).status_code == 204
        assert (await http.get("/v1/pushes/nope")).status_code == 401


async def test_a_backlog_from_before_a_restart_is_acked_and_left_to_the_replays(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    """A restarted gateway starts from its topics' log heads: a batch published while it
    was down is for clients that were elsewhere (or nowhere) then, and each gets it from
    its own replay, so the gateway acks it without writing it anywhere."""
    keys = KeySchema(prefix)
    async with api(redis_url, prefix) as http:
        # Subscribed once, then gone without leaving its groups: a crash (a clean stop
        # leaves them, and nothing is kept for it: test_redis_streams_trim.py).
        async with RedisStreamsBus(redis_url, prefix) as bus:
            await bus.prepare(gateway_topics("g1"), "gw1")
        resp = await http.post(
            "/v1/broadcast", json={"content": 1, "audience": {"online": True}}, headers=AUTH
        )
        await finished(http, resp.json()["push_id"])
        async with gateway(redis_url, prefix, "gw1", "g1") as gw:
            assert gw.follower is not None
            sequencer = gw.follower.sequencers["broadcast"]
            await wait_for(lambda: sequencer.late, "the late batch", 2.0, every=0.02)
            assert sequencer.late == 1 and gw.deliver_service.batches == 0
            await asyncio.sleep(0.1)
            pending = await redis.xpending(keys.bus_stream("broadcast"), "gw1")
            assert pending["pending"] == 0  # acked
        async with gateway(redis_url, prefix, "gw1", "g1") as gw:
            await asyncio.sleep(0.3)
            assert gw.follower is not None
            assert gw.follower.sequencers["broadcast"].late == 0  # not redelivered
