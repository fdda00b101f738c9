"""Draining a gateway: dispatch stops choosing it, each client is told to reconnect and
closed with 4503, pushes reach clients until their close, and routes go with them."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack

import pytest
import redis.asyncio as aioredis
from websockets.exceptions import ConnectionClosed

from shared.keys import KeySchema
from socket_gateway.app import CLOSE_DRAIN
from tests.integration.stack import AUTH, api, client, gateway, token, wait_for

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
                await http.get(
                    "/v1/dispatch", headers={"Authorization": f"Bearer {token(uid)}"}
                )
            ).json()
            assert chosen["gateway_id"] == "gw2"
        async with client(gw2, uids[0]):
            resp = await http.post(
                "/v1/push", json={"to": [uids[0]], "content": "after"}, headers=AUTH
            )
            assert resp.json()["delivered"] == [uids[0]]
