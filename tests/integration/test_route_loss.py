"""Routes lost while the gateway's fleet record is not (a Redis Cluster shard restarted
empty holds some users' routes and not the record, which is on another): the route
refresh finds them missing, writes them again, and those connections read what was
queued for them meanwhile. Real Redis, a real gateway and WebSocket client."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from shared.keys import KeySchema
from tests.integration.stack import AUTH, api, client, gateway, recv_json

pytestmark = pytest.mark.integration


async def test_a_connected_user_whose_route_was_lost_gets_what_was_queued_meanwhile(
    redis_url: str, prefix: str, redis: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        gateway(redis_url, prefix, "gw1", "g1", heartbeat_s=1, route_ttl_s=3) as gw,
        api(redis_url, prefix) as http,
        client(gw, "amy") as amy,
        client(gw, "bob") as bob,
    ):
        # amy's shard lost its data; the route refresh comes every second (ttl / 3)
        await redis.delete(KeySchema(prefix).route("amy"))
        resp = await http.post("/v1/push", json={"to": ["amy"], "content": "x"}, headers=AUTH)
        body = resp.json()
        assert (body["offline"], body["queued"]) == (["amy"], ["amy"]), body
        with caplog.at_level(logging.WARNING, "socket_gateway.heartbeat"):
            frame = await asyncio.wait_for(recv_json(amy), 5)  # was: at the next push
        assert (frame["type"], frame["content"], frame["push_id"]) == (
            "push", "x", body["push_id"]
        )  # fmt: skip
        lines = [r.getMessage() for r in caplog.records if "were missing" in r.getMessage()]
        assert lines and lines[0].startswith("route refresh: 1 of 2 routes"), lines
        # bob's route was there: he is not made to read his log again.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(bob.recv(), 0.5)
