"""P2P end to end: push API -> Redis routes -> the gateway call -> real WebSocket clients."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from shared.clock import ManualClock, SystemClock
from shared.keys import KeySchema
from shared.positions import decode_pos
from tests.conftest import SECRET
from tests.integration.stack import (
    AUTH,
    alice_online,
    api,
    client,
    gateway,
    nothing_more,
    one_group,
    ready,
    recv_json,
    token,
    two_groups,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]


async def test_push_reaches_the_client_exactly_once(redis_url: str, prefix: str) -> None:
    async with alice_online(redis_url, prefix) as (gw, http, ws):
        resp = await http.post(
            "/v1/push",
            json={"to": ["alice"], "content": {"text": "hi", "n": [1, 2]}, "msg_type": 3},
            headers=AUTH,
        )
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["delivered"] == ["alice"]
        assert body["offline"] == [] and body["failed"] == []
        frame = await recv_json(ws)
        assert frame == {
            "type": "push",
            "msg_id": body["msg_id"],
            "push_id": body["push_id"],
            "msg_type": 3,
            "from": "admin",
            "content": {"text": "hi", "n": [1, 2]},
            "ts": frame["ts"],
            "pos": frame["pos"],
        }
        assert isinstance(frame["ts"], int) and frame["ts"] > 1_700_000_000_000
        assert decode_pos(frame["pos"]) is not None
        assert await nothing_more(ws)
        assert gw.deliver_service.calls == 1


async def test_a_recipient_whose_route_key_redis_refuses_is_queued_and_the_others_delivered(
    redis_url: str, prefix: str, redis: Any
) -> None:
    """A route key holding a string (another app's, a hand edit) fails that recipient's
    look-up alone: the push answers 200, the others get it, and that user is taken as
    offline, the message queued in the inbox for when the key is right again."""
    async with alice_online(redis_url, prefix) as (gw, http, ws):
        await redis.set(KeySchema(prefix).route("bob"), "not a hash")
        resp = await http.post(
            "/v1/push", json={"to": ["alice", "bob"], "content": "hi"}, headers=AUTH
        )
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert (body["delivered"], body["offline"], body["queued"]) == (["alice"], ["bob"], ["bob"])
        assert (await recv_json(ws))["content"] == "hi"
        scrape = (await http.get("/metrics")).text
        # Counted per read refused (the push looks its offline recipients up twice).
        (refused,) = [
            float(line.split()[1])
            for line in scrape.splitlines()
            if line.startswith("imroute_route_reads_refused_total ")
        ]
        assert refused >= 1, scrape
        await redis.delete(KeySchema(prefix).route("bob"))
        async with connect(f"ws://127.0.0.1:{gw.ws_port}/ws?token={token('bob')}") as bob:
            assert [f["content"] for f in await ready(bob)] == ["hi"]


async def test_two_devices_of_one_user_both_get_it(redis_url: str, prefix: str) -> None:
    async with (
        two_groups(redis_url, prefix) as (gw1, gw2, http),
        client(gw1, "alice") as phone,
        client(gw1, "alice") as tablet,
        client(gw2, "alice") as laptop,
    ):
        resp = await http.post("/v1/push", json={"to": ["alice"], "content": "x"}, headers=AUTH)
        assert resp.json()["delivered"] == ["alice"]
        frames = [await recv_json(ws) for ws in (phone, tablet, laptop)]
        assert {f["msg_id"] for f in frames} == {resp.json()["msg_id"]}
        for ws in (phone, tablet, laptop):
            assert await nothing_more(ws, 0.2)
        assert (gw1.deliver_service.calls, gw2.deliver_service.calls) == (1, 1)


async def test_one_deliver_call_per_gateway_across_two_groups(redis_url: str, prefix: str) -> None:
    async with two_groups(redis_url, prefix) as (gw1, gw2, http):
        names1 = [f"a{i}" for i in range(5)]
        names2 = [f"b{i}" for i in range(5)]
        async with AsyncExitStack() as stack:
            sockets = [await stack.enter_async_context(client(gw1, n)) for n in names1]
            sockets += [await stack.enter_async_context(client(gw2, n)) for n in names2]
            resp = await http.post(
                "/v1/push",
                json={"to": [*names1, *names2, "nobody"], "content": {"k": 1}},
                headers=AUTH,
            )
            body = resp.json()
            assert sorted(body["delivered"]) == sorted(names1 + names2)
            assert body["offline"] == ["nobody"]
            for ws in sockets:
                assert (await recv_json(ws))["msg_id"] == body["msg_id"]
            assert (gw1.deliver_service.calls, gw2.deliver_service.calls) == (1, 1)
            routes = await http.get("/v1/users/b3/route", headers=AUTH)
            assert routes.json()["routes"][0]["group_id"] == "g2"


async def test_offline_user_is_reported(redis_url: str, prefix: str) -> None:
    async with one_group(redis_url, prefix) as (gw, http):
        resp = await http.post("/v1/push", json={"to": ["ghost"], "content": 1}, headers=AUTH)
        assert resp.status_code == 200
        assert resp.json()["offline"] == ["ghost"] and resp.json()["delivered"] == []
        assert gw.deliver_service.calls == 0


async def test_disconnect_removes_the_route(redis_url: str, prefix: str) -> None:
    async with one_group(redis_url, prefix) as (gw, http):
        async with client(gw, "alice"):
            route = (await http.get("/v1/users/alice/route", headers=AUTH)).json()
            assert route["online"] is True
            assert route["routes"] == [
                {"gateway_id": "gw1", "group_id": "g1", "ip": "127.0.0.1", "port": gw.grpc_port}
            ]
        await wait_for(lambda: len(gw.conns) == 0, "local removal")
        await asyncio.sleep(0.1)
        route = (await http.get("/v1/users/alice/route", headers=AUTH)).json()
        assert route == {"uid": "alice", "online": False, "routes": []}


async def test_gateways_are_listed(redis_url: str, prefix: str) -> None:
    async with two_groups(redis_url, prefix) as (gw1, _, http):
        listed = (await http.get("/v1/gateways", headers=AUTH)).json()["gateways"]
        assert [(g["gateway_id"], g["group_id"]) for g in listed] == [("gw1", "g1"), ("gw2", "g2")]
        assert listed[0]["ws_url"] == f"ws://127.0.0.1:{gw1.ws_port}/ws"
        assert listed[0]["grpc_address"] == f"127.0.0.1:{gw1.grpc_port}"
    async with api(redis_url, prefix) as http:
        # Withdrawn on clean shutdown.
        assert (await http.get("/v1/gateways", headers=AUTH)).json() == {"gateways": []}


@pytest.mark.parametrize("bad", ["none", "garbage", "expired", "wrong-secret"])
async def test_bad_tokens_get_401_before_registering(
    redis_url: str, prefix: str, redis: object, bad: str
) -> None:
    import jwt

    now = SystemClock().now_ms() // 1000
    tokens = {
        "none": "",
        "garbage": "?token=not.a.jwt",
        # Past IMROUTE_JWT_LEEWAY_S (30 s).
        "expired": "?token=" + jwt.encode({"sub": "alice", "exp": now - 31}, SECRET, "HS256"),
        "wrong-secret": "?token="
        + jwt.encode({"sub": "alice", "exp": now + 60}, "w" * 32, "HS256"),
    }
    async with gateway(redis_url, prefix, "gw1", "g1") as gw:
        with pytest.raises(InvalidStatus) as refused:
            await connect(f"ws://127.0.0.1:{gw.ws_port}/ws{tokens[bad]}")
        assert refused.value.response.status_code == 401
        assert json.loads(refused.value.response.body)["error"] == "unauthorized"
        assert len(gw.conns) == 0
        assert await redis.exists(KeySchema(prefix).route("alice")) == 0  # type: ignore[attr-defined]


async def test_ping_pong_and_junk_frames(redis_url: str, prefix: str) -> None:
    async with one_group(redis_url, prefix) as (gw, http):
        async with client(gw, "bystander") as bystander:
            for junk, code in [("not json", 1008), ('{"type":"push"}', 1008), (b"\x00\x01", 1003)]:
                async with client(gw, "junky") as ws:
                    await ws.send('{"type":"ping"}')
                    assert await recv_json(ws) == {"type": "pong"}
                    await ws.send(junk)
                    with pytest.raises(ConnectionClosed) as closed:
                        await asyncio.wait_for(ws.recv(), 3)
                    assert closed.value.rcvd is not None and closed.value.rcvd.code == code
            async with client(gw, "junky") as ws:
                await ws.send("x" * 10_000)  # over the client frame limit
                with pytest.raises(ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), 3)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
            # The bystander is unaffected and still reachable.
            await bystander.send('{"type":"ping"}')
            assert await recv_json(bystander) == {"type": "pong"}
            resp = await http.post(
                "/v1/push", json={"to": ["bystander"], "content": 1}, headers=AUTH
            )
            assert resp.json()["delivered"] == ["bystander"]
            assert (await recv_json(bystander))["content"] == 1


async def test_wrong_path_is_404(redis_url: str, prefix: str) -> None:
    from websockets.exceptions import InvalidStatus

    async with gateway(redis_url, prefix, "gw1", "g1") as gw:
        with pytest.raises(InvalidStatus) as info:
            async with connect(f"ws://127.0.0.1:{gw.ws_port}/other?token={token('a')}"):
                pass
        assert info.value.response.status_code == 404


async def test_unreachable_gateway_is_reported_not_dropped(redis_url: str, prefix: str) -> None:
    async with (
        gateway(redis_url, prefix, "gw1", "g1") as gw1,
        api(redis_url, prefix, deliver_timeout_s=1.0) as http,
        client(gw1, "alice"),
    ):
        # gw1's gRPC server (and delivery link) die while its routes and fleet record
        # still look fine.
        assert gw1.ports is not None and gw1.ports.link is not None
        await gw1.ports.grpc.stop(None)
        await gw1.ports.link.close()
        resp = await http.post(
            "/v1/push", json={"to": ["alice", "bob"], "content": 1}, headers=AUTH
        )
        body = resp.json()
        assert resp.status_code == 200
        assert body["delivered"] == []
        assert body["failed"] == ["alice"]
        assert body["offline"] == ["bob"]
        assert [e["gateway_id"] for e in body["errors"]] == ["gw1"]
        assert "UNAVAILABLE" in body["errors"][0]["error"]


async def test_routes_of_a_gateway_missing_from_the_fleet_are_called_not_skipped(
    redis_url: str, prefix: str
) -> None:
    """Its fleet record gone while its routes are live, a gateway's state is unknown:
    cut off from Redis, it still serves its clients. Before, its users were answered
    `offline` (and queued) with no error, like users who are gone; now the gateway is
    called at the route's address, and when that fails too the error says its state is
    unknown."""
    # A heartbeat far off: nothing announces gw1 again during the test.
    async with (
        gateway(redis_url, prefix, "gw1", "g1", heartbeat_s=20) as gw1,
        api(redis_url, prefix) as http,
    ):
        async with client(gw1, "alice") as ws:
            assert gw1.fleet is not None
            await gw1.fleet.withdraw("gw1")
            resp = await http.post("/v1/push", json={"to": ["alice"], "content": 1}, headers=AUTH)
            assert resp.json()["delivered"] == ["alice"], resp.json()
            assert (await recv_json(ws))["content"] == 1
            # Now dead as well (its gRPC server and link gone, its routes still live).
            assert gw1.ports is not None and gw1.ports.link is not None
            await gw1.ports.grpc.stop(None)
            await gw1.ports.link.close()
            resp = await http.post("/v1/push", json={"to": ["alice"], "content": 2}, headers=AUTH)
            body = resp.json()
            assert body["failed"] == ["alice"] and body["offline"] == [], body
            assert body["queued"] == ["alice"], body
            assert [e["gateway_id"] for e in body["errors"]] == ["gw1"]
            assert body["errors"][0]["error"].startswith("GATEWAY_STATE_UNKNOWN: gw1 "), body


async def test_push_body_is_json_encoded_once_and_unicode_survives(
    redis_url: str, prefix: str
) -> None:
    async with one_group(redis_url, prefix) as (gw, http):
        async with client(gw, "ünï") as ws:
            content = {"text": "héllo 👋", "nested": {"a": [None, True, 1.5]}}
            resp = await http.post(
                "/v1/push", json={"to": ["ünï"], "content": content, "from": "bot"}, headers=AUTH
            )
            assert resp.json()["delivered"] == ["ünï"]
            frame = await recv_json(ws)
            assert frame["content"] == content and frame["from"] == "bot"
            assert json.dumps(frame)  # valid JSON all the way


async def test_concurrent_pushes_to_one_gateway_share_rpcs(redis_url: str, prefix: str) -> None:
    async with one_group(redis_url, prefix) as (gw, http):
        async with AsyncExitStack() as stack:
            names = [f"c{i}" for i in range(20)]
            sockets = [await stack.enter_async_context(client(gw, n)) for n in names]
            pushes = [
                http.post("/v1/push", json={"to": [names[i % 20]], "content": i}, headers=AUTH)
                for i in range(200)
            ]
            answers = [r.json() for r in await asyncio.gather(*pushes)]
            assert all(a["delivered"] for a in answers)
            # Every push is its own batch, but queued batches shared DeliverMany calls.
            assert gw.deliver_service.batches == 200
            assert gw.deliver_service.calls < 200
            got: dict[str, list[int]] = {}
            for name, ws in zip(names, sockets, strict=True):
                got[name] = sorted([(await recv_json(ws))["content"] for _ in range(10)])
                assert await nothing_more(ws, 0.05)
            assert got == {n: list(range(i, 200, 20)) for i, n in enumerate(names)}


async def test_a_push_past_its_ttl_is_dropped_at_the_gateway_and_reported(
    redis_url: str, prefix: str
) -> None:
    # The gateway's clock runs ten minutes ahead: every batch reaches it "late".
    ahead = ManualClock(wall_ms=SystemClock().now_ms() + 600_000, mono=0.0)
    async with (
        gateway(redis_url, prefix, "gw1", "g1", clock=ahead) as gw,
        api(redis_url, prefix) as http,
        client(gw, "alice") as ws,
    ):
        late = await http.post(
            "/v1/push", json={"to": ["alice"], "content": 1, "ttl_s": 60}, headers=AUTH
        )
        assert late.json()["failed"] == ["alice"]
        assert "EXPIRED" in late.json()["errors"][0]["error"]
        assert await nothing_more(ws, 0.2)
        assert gw.deliver_service.expired == 1
        # Without a ttl the push expires at the end of its call: that gateway drops it
        # too, and since the call still had time, it says its clock is off.
        body = {"to": ["alice"], "content": 2, "store": False}
        skewed = await http.post("/v1/push", json=body, headers=AUTH)
        assert skewed.json()["failed"] == ["alice"]
        assert await nothing_more(ws, 0.2)
        assert gw.deliver_service.expired == 2 and gw.deliver_service.skewed.total == 2
