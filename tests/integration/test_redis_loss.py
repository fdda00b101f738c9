"""Redis loses its data (a restart without persistence): gateways put every route and
their fleet record back within a heartbeat, and P2P works again."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack

import pytest
import redis.asyncio as aioredis

from shared.keys import KeySchema
from tests.integration.stack import AUTH, api, client, gateway, recv_json

pytestmark = pytest.mark.integration


async def test_routes_come_back_within_seconds_after_redis_lost_its_data(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    uids = [f"r{i}" for i in range(30)]
    keys = KeySchema(prefix)
    # Routes are refreshed every route_ttl_s / 3 = 20 s: only the lost fleet record,
    # seen at the next heartbeat, can bring them back this fast.
    async with (
        gateway(redis_url, prefix, "gw1", "g1", heartbeat_s=0.5, route_ttl_s=60) as gw,
        api(redis_url, prefix) as http,
        AsyncExitStack() as stack,
    ):
        sockets = {uid: await stack.enter_async_context(client(gw, uid)) for uid in uids}
        lost = [k async for k in redis.scan_iter(match=f"{prefix}*")]
        await redis.delete(*lost)  # what a restart with an empty dataset leaves
        started = time.monotonic()
        while await redis.exists(*(keys.route(uid) for uid in uids)) < len(uids):
            assert time.monotonic() - started < 5, "routes were not re-registered in 5 s"
            await asyncio.sleep(0.05)
        assert await redis.exists(keys.gateway("gw1")) == 1
        resp = await http.post("/v1/push", json={"to": uids, "content": "back"}, headers=AUTH)
        assert sorted(resp.json()["delivered"]) == sorted(uids)
        for ws in sockets.values():
            assert (await recv_json(ws))["content"] == "back"
