"""Client acks, the inbox and receipts: a real gateway (gRPC and WebSocket), the API,
real Redis and raw WebSocket clients."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import ClientConnection, connect

from shared.keys import KeySchema, slot_tagged
from tests.integration.fault_clients import TcpProxy
from tests.integration.recovery_helpers import (
    ack,
    acked,
    connected,
    open_ws,
    pushes,
    reconnect,
    replay,
)
from tests.integration.stack import (
    AUTH,
    api,
    contents,
    gateway,
    one_group,
    p2p,
    push_status,
    recv_json,
    token,
)

pytestmark = pytest.mark.integration


async def test_an_acked_push_leaves_the_inbox_and_its_receipt_says_acked(
    redis_url: str, prefix: str
) -> None:
    async with one_group(redis_url, prefix) as (gw, http):
        ws = await connected(gw, "ana")
        body = await p2p(http, ["ana", "ben"], "hello")
        assert body["delivered"] == ["ana"] and body["offline"] == ["ben"]
        first = await push_status(http, body["push_id"])
        assert first["mode"] == "p2p" and first["listable"] is True
        assert (first["recipients"], first["online"], first["offline"]) == (2, 1, 1)
        assert (first["delivered"], first["acked"], first["queued"]) == (1, 0, 1)
        (frame,) = await pushes(ws, 1)
        await ack(ws, frame)
        await acked(gw, 1)
        after = await push_status(http, body["push_id"])
        assert (after["delivered"], after["acked"], after["queued"]) == (1, 1, 1)
        assert await reconnect(gw, ws, "ana") == []  # acked: out of the inbox
        # Ben connects: the replay delivers it (his receipt state moves to delivered).
        ws = await open_ws(gw, "ben")
        got, _ = await replay(ws)
        assert contents(got) == ["hello"]
        for _ in range(100):
            if (await push_status(http, body["push_id"]))["queued"] == 0:
                break
            await asyncio.sleep(0.05)
        last = await push_status(http, body["push_id"])
        assert (last["delivered"], last["acked"], last["queued"]) == (2, 1, 0)
        await ws.close()
        # store:false to someone offline: kept nowhere, so expired for them, not queued.
        gone_push = await p2p(http, ["nobody"], "typing", store=False)
        s = await push_status(http, gone_push["push_id"])
        assert (s["delivered"], s["queued"], s["expired"]) == (0, 0, 1)


async def test_a_push_never_acked_comes_again_and_a_cumulative_ack_covers_all_before(
    redis_url: str, prefix: str
) -> None:
    async with one_group(redis_url, prefix) as (gw, http):
        ws = await connected(gw, "cy")
        ids = [(await p2p(http, ["cy"], n))["push_id"] for n in range(3)]
        frames = await pushes(ws, 3)
        # Received, never acked (auto-ack off): every one is in the inbox still.
        got = await reconnect(gw, ws, "cy")
        assert contents(got) == [0, 1, 2] and all(f["recovered"] for f in got)
        ws = await open_ws(gw, "cy")
        frames, _ = await replay(ws)
        await ack(ws, frames[2])  # the last one's pos: all three
        await acked(gw, 3)
        for push_id in ids:
            assert (await push_status(http, push_id))["acked"] == 1
        assert await reconnect(gw, ws, "cy") == []


async def test_two_devices_acking_out_of_step_leave_the_inbox_at_the_furthest_ack(
    redis_url: str, prefix: str
) -> None:
    """A message is acked once any device acked it: a device whose ack comes after
    another's, and covers less, takes nothing back into the inbox; what neither acked
    stays, for both, and a third device gets it."""
    async with one_group(redis_url, prefix) as (gw, http):
        phone, laptop = await connected(gw, "dee"), await connected(gw, "dee")
        for n in range(4):
            await p2p(http, ["dee"], n)
        on_phone, on_laptop = await pushes(phone, 4), await pushes(laptop, 4)
        await ack(phone, on_phone[2])  # 0, 1, 2
        await acked(gw, 3)
        await ack(laptop, on_laptop[0])  # later, and behind: 0 only
        await acked(gw, 4)
        tablet = await open_ws(gw, "dee")
        got, end = await replay(tablet)
        assert contents(got) == [3] and end["complete"] is True
        await ack(laptop, on_laptop[3])
        await acked(gw, 7)
        await phone.close()
        await laptop.close()
        assert await reconnect(gw, tablet, "dee") == []


async def test_a_p2p_receipt_follows_the_acked_position_and_outlives_the_log(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    """A stored P2P push's receipt reads its acks from the user's acked position: no
    mark is written for them, two devices acking out of step count once, at the
    furthest, and the receipt still says acked once the log lapsed."""
    async with one_group(redis_url, prefix) as (gw, http):
        phone, laptop = await connected(gw, "eve"), await connected(gw, "eve")
        ids = [(await p2p(http, ["eve"], n))["push_id"] for n in range(3)]
        assert all(slot_tagged(i) for i in ids)
        on_phone, on_laptop = await pushes(phone, 3), await pushes(laptop, 3)
        await ack(laptop, on_laptop[1])  # 0 and 1
        await acked(gw, 2)
        await ack(phone, on_phone[0])  # later, and behind: takes nothing back
        await acked(gw, 3)
        assert [(await push_status(http, i))["acked"] for i in ids] == [1, 1, 0]
        keys = KeySchema(prefix)
        value = str(await redis.hget(keys.receipt(ids[0])[0], "u:eve"))
        assert value[0] == "d" and value[1:].isdigit()  # as recorded: no mark came
        await redis.delete(keys.user_log("eve"))  # lapsed (one window after the acks)
        assert [(await push_status(http, i))["acked"] for i in ids] == [1, 1, 0]
        # The position lives in the user's sequence, which outlives the receipts.
        assert await redis.pttl(keys.user_seq("eve")) > 86_400_000


async def test_bad_acks_are_ignored_counted_and_never_close(redis_url: str, prefix: str) -> None:
    async with (
        gateway(redis_url, prefix, "gw1", "g1", metrics_port=0) as gw,
        api(redis_url, prefix) as http,
    ):
        ws = await connected(gw, "dee")
        await p2p(http, ["dee"], "x")
        (frame,) = await pushes(ws, 1)
        bad: list[Any] = [
            {"type": "ack"},
            {"type": "ack", "pos": 12},
            {"type": "ack", "pos": "1~999~0~0~~0"},  # ahead of what was sent
            {"type": "ack", "pos": "nonsense"},
        ]
        for junk in bad:
            await ws.send(json.dumps(junk))
        await ws.send('{"type":"ping"}')
        assert await recv_json(ws) == {"type": "pong"}  # still open
        assert gw.acks is not None and gw.acks.counts.bad == 4
        await ack(ws, frame)
        await ack(ws, frame)  # already acked: ignored too
        await acked(gw, 1)
        await ws.send('{"type":"ping"}')
        assert await recv_json(ws) == {"type": "pong"}
        assert gw.acks.counts.bad == 5
        scrape = (await httpx.AsyncClient().get(f"http://127.0.0.1:{gw.metrics_port}/metrics")).text
        assert "imroute_gateway_bad_acks_total 5.0" in scrape, scrape
        await ws.close()


async def _acking(ws: ClientConnection) -> None:
    """A client that acks each push as it arrives."""
    while True:
        frame = json.loads(await ws.recv())
        if frame["type"] == "push":
            await ack(ws, frame)


async def test_wait_ack_ms_lists_who_acked_and_returns_early_when_all_did(
    redis_url: str, prefix: str
) -> None:
    async with one_group(redis_url, prefix) as (gw, http):
        users = ["w1", "w2", "w3", "quiet"]
        sockets = {u: await open_ws(gw, u) for u in users}
        for ws in sockets.values():
            await replay(ws)
        readers = [asyncio.create_task(_acking(sockets[u])) for u in users[:3]]
        begun = time.monotonic()
        resp = await http.post(
            "/v1/push",
            json={"to": [*users, "away"], "content": "ping?", "wait_ack_ms": 1500},
            headers=AUTH,
        )
        took = time.monotonic() - begun
        body = resp.json()
        assert resp.status_code == 200, body
        assert sorted(body["acked"]) == ["w1", "w2", "w3"]
        assert body["unacked"] == ["quiet", "away"]
        assert 1.4 <= took < 4.0, took  # it waited for "quiet", about wait_ack_ms
        # Every online recipient acks: the answer comes well before wait_ack_ms.
        readers.append(asyncio.create_task(_acking(sockets["quiet"])))
        begun = time.monotonic()
        resp = await http.post(
            "/v1/push", json={"to": users, "content": "all?", "wait_ack_ms": 8000}, headers=AUTH
        )
        took = time.monotonic() - begun
        assert sorted(resp.json()["acked"]) == sorted(users), (took, resp.json())
        assert resp.json()["unacked"] == []
        assert took < 4.0, took
        for task in readers:
            task.cancel()
        for ws in sockets.values():
            await ws.close()
        # Bad input: a clear 422.
        bad = await http.post(
            "/v1/push", json={"to": ["w1"], "content": 1, "wait_ack_ms": 10_001}, headers=AUTH
        )
        assert bad.status_code == 422 and "wait_ack_ms" in bad.text


async def test_a_half_open_connection_gets_its_push_again_on_reconnect(
    redis_url: str, prefix: str
) -> None:
    """Written to a socket the network no longer carries (no close, no FIN): the push
    counts as delivered, but stays in the inbox until acked, so the next connection
    (even one that lost its position) gets it."""
    async with one_group(redis_url, prefix) as (gw, http):
        proxy = TcpProxy(gw.ws_port)
        await proxy.start()
        ws = await connect(
            f"ws://127.0.0.1:{proxy.port}/ws?token={token('hal')}", ping_interval=None
        )
        await replay(ws)
        await p2p(http, ["hal"], "seen")
        (seen,) = await pushes(ws, 1)
        await ack(ws, seen)
        await acked(gw, 1)
        proxy.cut()
        body = await p2p(http, ["hal"], "lost on the wire")
        assert body["delivered"] == ["hal"]  # written to the socket: "delivered"
        ws.transport.abort()
        # The gateway only learns of it from its keepalive; a new device connects now.
        fresh = await open_ws(gw, "hal")
        got, _ = await replay(fresh)
        assert contents(got) == ["lost on the wire"]
        assert (await push_status(http, body["push_id"]))["acked"] == 0
        await fresh.close()
        await proxy.aclose()


async def test_the_sdk_acks_and_with_auto_ack_off_the_app_does(redis_url: str, prefix: str) -> None:
    """The Python SDK against the real gateway: it acks once the app is done with a push
    (the receipt says acked); with auto_ack off nothing is acked until the app acks, and
    a reconnect meanwhile brings the push again, handed over once."""
    from imroute_client import ImrouteClient

    from tests.integration.sdk import API, next_message, push

    async with one_group(redis_url, prefix) as (gw, http):
        async with ImrouteClient(API, token("sam"), http=http) as client:
            await client.connect()
            await asyncio.sleep(0.2)  # its route lands
            resp = await http.post("/v1/push", json={"to": ["sam"], "content": 1}, headers=AUTH)
            push_id = resp.json()["push_id"]
            assert (await next_message(client)).content == 1
            # Done with it: asking for the next one acks it.
            waiting = asyncio.ensure_future(anext(client))
            await acked(gw, 1)
            assert (await push_status(http, push_id))["acked"] == 1
            waiting.cancel()
        async with ImrouteClient(API, token("tom"), http=http, auto_ack=False) as manual:
            await manual.connect()
            await asyncio.sleep(0.2)
            assert await push(http, "tom", 2) == ["tom"]
            msg = await next_message(manual)
            waiting = asyncio.ensure_future(anext(manual))
            await asyncio.sleep(0.4)
            assert gw.acks is not None and gw.acks.counts.acked == 1  # only sam's
            waiting.cancel()
        # Never acked: a new connection (no position kept) gets it again, once.
        async with ImrouteClient(API, token("tom"), http=http, auto_ack=False) as again:
            await again.connect()
            redo = await next_message(again)
            assert (redo.msg_id, redo.recovered) == (msg.msg_id, True)
            await again.ack(redo)
            await acked(gw, 2)


async def test_the_sdk_on_a_half_open_connection_gets_the_push_again_and_yields_it_once(
    redis_url: str, prefix: str
) -> None:
    """The SDK's link goes silent (a proxy that forwards nothing and closes nothing):
    the push the gateway wrote to it meanwhile comes again once the SDK's pings find
    the link dead and it reconnects, and the SDK hands it over once."""
    from imroute_client import ImrouteClient

    from router.processes.ports import free_port
    from tests.integration.sdk import API, next_message

    ws_port = free_port()
    proxy = TcpProxy(ws_port)
    await proxy.start()
    public = f"ws://127.0.0.1:{proxy.port}/ws"
    async with (
        gateway(redis_url, prefix, "gw1", "g1", ws_port=ws_port, ws_public_url=public) as gw,
        api(redis_url, prefix) as http,
        ImrouteClient(
            API, token("hank"), http=http, ping_interval_s=0.3, ping_timeout_s=0.3
        ) as client,
    ):
        await client.connect()
        await asyncio.sleep(0.2)
        await p2p(http, ["hank"], "before")
        assert (await next_message(client)).content == "before"
        got: list[Any] = []

        async def pump() -> None:
            async for msg in client:
                got.append(msg)

        reader = asyncio.create_task(pump())
        await acked(gw, 1)
        proxy.cut()  # new connections through it still work; this one carries nothing
        body = await p2p(http, ["hank"], "into the void")
        assert body["delivered"] == ["hank"]  # written to the dead link's socket
        for _ in range(200):
            if got:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # nothing more comes
        assert [(m.content, m.recovered) for m in got] == [("into the void", True)]
        assert client.stats.connects >= 2
        reader.cancel()
    await proxy.aclose()
