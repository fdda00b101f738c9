"""Draining a gateway: dispatch stops choosing it, each client is told to reconnect and
closed with 4503, pushes reach clients until their close, and routes go with them."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack

import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from shared.keys import KeySchema
from socket_gateway.app import CLOSE_DRAIN
from tests.integration.stack import AUTH, api, client, gateway, token
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


async def test_a_drained_gateway_moves_its_clients_without_losing_pushes(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    uids = [f"d{i}" for i in range(20)]
    async with (
        gateway(redis_url, prefix, "gw1", "g1", heartbeat_s=0.2, drain_window_s=1.0) as gw1,
        gateway(redis_url, prefix, "gw2", "g1", heartbeat_s=0.2) as gw2,
        api(redis_url, prefix, dispatch_rule="round_robin") as http,
        AsyncExitStack() as stack,
    ):
        sockets = {uid: await stack.enter_async_context(client(gw1, uid)) for uid in uids}
        assert (await http.post("/v1/gateways/nope/drain", headers=AUTH)).status_code == 404
        assert (await http.post("/v1/gateways/gw1/drain")).status_code == 401
        resp = await http.post("/v1/gateways/gw1/drain", headers=AUTH)
        assert resp.status_code == 202 and resp.json() == {"gateway_id": "gw1", "draining": True}
        await wait_for(lambda: gw1.draining, "gw1 draining (its next heartbeat)")

        # While the clients are closed one by one, pushes still reach those not yet closed.
        received: dict[str, list[dict[str, object]]] = {uid: [] for uid in uids}
        closes: dict[str, int] = {}

        async def read(uid: str) -> None:
            try:
                async for data in sockets[uid]:
                    received[uid].append(json.loads(data))
            except ConnectionClosed:
                pass
            rcvd = sockets[uid].close_code
            closes[uid] = rcvd if rcvd is not None else -1

        readers = [asyncio.create_task(read(uid)) for uid in uids]
        delivered: dict[str, int] = {uid: 0 for uid in uids}
        for n in range(10):
            body = (
                await http.post("/v1/push", json={"to": uids, "content": n}, headers=AUTH)
            ).json()
            for uid in body["delivered"]:
                delivered[uid] += 1
            await asyncio.sleep(0.1)
        await asyncio.wait_for(asyncio.gather(*readers), 10)

        assert set(closes.values()) == {CLOSE_DRAIN}
        for uid in uids:
            frames = received[uid]
            assert frames[0] == {"type": "reconnect", "reason": "drain"}
            pushes = [f["content"] for f in frames[1:]]
            # Every push the API reported delivered reached the client, once, in order.
            assert pushes == sorted(set(pushes)) and len(pushes) == delivered[uid]
        assert sum(delivered.values()) > 0  # some pushes landed during the drain
        await gw1.drained.wait()
        await wait_for(lambda: len(gw1.conns) == 0, "gw1 empty")
        keys = KeySchema(prefix)
        for _ in range(50):  # each close unregisters its route (writes are coalesced)
            if await redis.exists(*(keys.route(uid) for uid in uids)) == 0:
                break
            await asyncio.sleep(0.02)
        assert await redis.exists(*(keys.route(uid) for uid in uids)) == 0

        # Dispatch sends the clients elsewhere; they reconnect there.
        for uid in uids[:5]:
            chosen = (
                await http.get("/v1/dispatch", headers={"Authorization": f"Bearer {token(uid)}"})
            ).json()
            assert chosen["gateway_id"] == "gw2"
        async with client(gw2, uids[0]):
            resp = await http.post(
                "/v1/push", json={"to": [uids[0]], "content": "after"}, headers=AUTH
            )
            assert resp.json()["delivered"] == [uids[0]]


async def test_200_clients_under_a_push_stream_all_move_and_lose_nothing_delivered(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    """At a realistic scale: 200 clients on gw1, a push to all of them every 50 ms, and gw1
    drained. Each client behaves as a real one would: on its 4503 it asks dispatch where
    to go, and reconnects there."""
    uids = [f"c{i:03}" for i in range(200)]
    loop = asyncio.get_running_loop()
    received: dict[str, list[int]] = {uid: [] for uid in uids}
    told_at: dict[str, float] = {}  # when each client read its reconnect frame
    moved_to: dict[str, str] = {}
    closed_at: dict[str, float] = {}
    closes: dict[str, int | None] = {}
    settled: dict[str, asyncio.Event] = {uid: asyncio.Event() for uid in uids}
    async with (
        # A 1-s heartbeat (a 3-s fleet record): this one process carries 200 clients,
        # three gateways and the push stream, and under a suite's load a 0.6-s record
        # lapsed mid-stream, rightly queuing pushes before the drain that the test
        # counts as live.
        gateway(redis_url, prefix, "gw1", "g1", heartbeat_s=1.0, drain_window_s=2.0) as gw1,
        gateway(redis_url, prefix, "gw2", "g1", heartbeat_s=1.0) as gw2,
        gateway(redis_url, prefix, "gw3", "g2", heartbeat_s=1.0) as gw3,
        api(redis_url, prefix) as http,  # consistent_hash, the default
    ):
        by_id = {"gw1": gw1, "gw2": gw2, "gw3": gw3}
        seen: dict[str, set[str]] = {uid: set() for uid in uids}

        def take(uid: str, frame: dict[str, object]) -> None:
            """As a client does: ack every push, drop repeats by msg_id (delivery is
            at-least-once: an ack still on its way when the client moved leaves the
            push in the inbox its new connection reads)."""
            msg_id = str(frame["msg_id"])
            if msg_id not in seen[uid]:
                seen[uid].add(msg_id)
                received[uid].append(int(str(frame["content"])))

        async def run_client(uid: str) -> None:
            url = f"ws://127.0.0.1:{gw1.ws_port}/ws?token={token(uid)}"
            async with connect(url) as ws:
                settled[uid].set()
                try:
                    async for data in ws:
                        frame = json.loads(data)
                        if frame.get("type") == "reconnect":
                            told_at[uid] = loop.time()
                        elif frame["type"] == "push":
                            take(uid, frame)
                            await ws.send(json.dumps({"type": "ack", "pos": frame["pos"]}))
                except ConnectionClosed:
                    pass
                closes[uid] = ws.close_code
                closed_at[uid] = loop.time()
            settled[uid].clear()
            headers = {"Authorization": f"Bearer {token(uid)}"}
            chosen = (await http.get("/v1/dispatch", headers=headers)).json()
            moved_to[uid] = chosen["gateway_id"]
            async with connect(f"{chosen['ws_url']}?token={token(uid)}") as ws:
                target = by_id[chosen["gateway_id"]]
                await wait_for(lambda: any(c.uid == uid for c in target.conns), uid)
                settled[uid].set()
                async for data in ws:  # until the test ends
                    frame = json.loads(data)
                    if frame["type"] == "push":
                        take(uid, frame)
                        await ws.send(json.dumps({"type": "ack", "pos": frame["pos"]}))

        clients = [asyncio.create_task(run_client(uid)) for uid in uids]
        try:
            for uid in uids:
                await asyncio.wait_for(settled[uid].wait(), 10)
            await wait_for(lambda: len(gw1.conns) == len(uids), "200 clients on gw1")
            route_keys = [KeySchema(prefix).route(uid) for uid in uids]
            for _ in range(250):  # route writes are coalesced: wait until all are in
                if await redis.exists(*route_keys) == len(uids):
                    break
                await asyncio.sleep(0.02)
            assert await redis.exists(*route_keys) == len(uids)

            # The push stream: every 50 ms, one push to all 200, numbered.
            delivered: dict[str, list[int]] = {uid: [] for uid in uids}
            queued: dict[str, list[int]] = {uid: [] for uid in uids}
            answered_at: list[float] = []
            undelivered = 0
            stop = asyncio.Event()
            everyone = asyncio.Event()  # set by a push delivered to all 200

            async def stream() -> None:
                nonlocal undelivered
                n = 0
                while not stop.is_set():
                    body = (
                        await http.post("/v1/push", json={"to": uids, "content": n}, headers=AUTH)
                    ).json()
                    answered_at.append(loop.time())
                    assert "delivered" in body, body
                    assert len(body["delivered"]) + len(body["offline"]) + len(
                        body["failed"]
                    ) == len(uids)
                    for uid in body["delivered"]:
                        delivered[uid].append(n)
                    for uid in body["queued"]:
                        queued[uid].append(n)
                    undelivered += len(uids) - len(body["delivered"])
                    if len(body["delivered"]) == len(uids) and moved_to:
                        everyone.set()
                    n += 1
                    await asyncio.sleep(0.05)

            pusher = asyncio.create_task(stream())
            await wait_for(lambda: len(answered_at) >= 3, "the first pushes")
            drain_sent = loop.time()
            resp = await http.post("/v1/gateways/gw1/drain", headers=AUTH)
            assert resp.status_code == 202
            await asyncio.wait_for(gw1.drained.wait(), 15)
            await wait_for(lambda: len(moved_to) == len(uids), "every client moved", 10)
            for uid in uids:
                await asyncio.wait_for(settled[uid].wait(), 10)
            # Pushes go on until one reaches all 200 on their new gateways.
            everyone.clear()
            await asyncio.wait_for(everyone.wait(), 10)
            stop.set()
            await asyncio.wait_for(pusher, 10)
            pushes = len(answered_at)
            await wait_for(
                lambda: all(received[u] == list(range(pushes)) for u in uids), "the last frames"
            )

            assert set(closes.values()) == {CLOSE_DRAIN}
            assert set(moved_to.values()) <= {"gw2", "gw3"}
            assert {"gw2", "gw3"} == set(moved_to.values())  # both groups take users
            assert len(gw1.conns) == 0
            assert len(gw2.conns) + len(gw3.conns) == len(uids)
            for uid in uids:
                # Every push arrived exactly once, in order: live where it was delivered,
                # from the inbox on the new gateway where the move left it queued.
                assert sorted(delivered[uid] + queued[uid]) == list(range(pushes)), uid
                assert received[uid] == list(range(pushes)), uid
                # Until the drain, it got every push live: the queued are around its move.
                assert all(answered_at[n] > drain_sent for n in queued[uid]), uid
                # And the last push, after everyone moved, reached it on its new gateway.
                assert pushes - 1 in delivered[uid], uid
            # Many clients got pushes on gw1 after their reconnect frame: the gateway
            # delivers until each close, not just until the drain began.
            late = sum(
                1
                for uid in uids
                if any(told_at[uid] < answered_at[n] < closed_at[uid] for n in delivered[uid])
            )
            print(f"{pushes} pushes, {undelivered} undelivered, {late} got pushes while told")
            assert late > len(uids) // 4
        finally:
            for task in clients:
                task.cancel()
            await asyncio.gather(*clients, return_exceptions=True)


async def test_a_drain_request_is_taken_once_and_only_by_the_boot_it_was_for(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    """A restarted gateway with the same id (compose `restart: unless-stopped`) must not
    drain itself again on a request meant for its previous life."""
    keys = KeySchema(prefix)
    async with api(redis_url, prefix) as http:
        async with gateway(redis_url, prefix, "gw1", "g1", heartbeat_s=0.2, drain_window_s=0) as gw:
            # gw1 is its group's only gateway: draining it takes force.
            resp = await http.post("/v1/gateways/gw1/drain?force=true", headers=AUTH)
            assert resp.status_code == 202, resp.text
            assert await redis.get(keys.drain("gw1")) == str(gw.info.started_ms)
            await asyncio.wait_for(gw.drained.wait(), 5)
            # Taken as the drain began: marked, not deleted (it counts until it lapses).
            assert await redis.get(keys.drain("gw1")) == f"{gw.info.started_ms}!"
        # A request for some other boot of gw1 (a stale one) is dropped, not obeyed.
        await redis.set(keys.drain("gw1"), "1", ex=60)
        async with gateway(redis_url, prefix, "gw1", "g1", heartbeat_s=0.2) as gw:
            for _ in range(100):
                if not await redis.exists(keys.drain("gw1")):
                    break
                await asyncio.sleep(0.02)
            assert await redis.exists(keys.drain("gw1")) == 0
            await asyncio.sleep(0.5)
            assert not gw.draining
