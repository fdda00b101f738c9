"""The push service and two gateways in one process on one MemoryBus: broadcast and
multicast reach real WebSocket clients, as on Redis Streams and Pub/Sub."""

from __future__ import annotations

import pytest

from router.testing import MemoryBus
from tests.integration.stack import AUTH, client, nothing_more, recv_json, two_groups
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]


async def test_one_memory_bus_carries_broadcast_and_multicast_to_every_gateway(
    redis_url: str, prefix: str
) -> None:
    async with MemoryBus() as bus:
        async with (
            two_groups(redis_url, prefix, bus) as (gw1, gw2, http),
            client(gw1, "ann") as ann,
            client(gw2, "bob") as bob,
        ):
            everyone = {"audience": {"online": True}, "content": "to all"}
            resp = await http.post("/v1/broadcast", json=everyone, headers=AUTH)
            assert resp.status_code == 202, resp.text
            for ws in (ann, bob):
                assert (await recv_json(ws))["content"] == "to all"

            body = {"to": ["ann", "bob", "nobody"], "content": "to two"}
            resp = await http.post("/v1/multicast", json=body, headers=AUTH)
            assert resp.status_code == 202, resp.text
            for ws in (ann, bob):
                frame = await recv_json(ws)
                assert (frame["content"], frame["push_id"]) == ("to two", resp.json()["push_id"])
                assert await nothing_more(ws, 0.2)
            # The broadcast, the group batch, and "nobody" in the offline log (followed by
            # both, from Redis: its head is read every second).
            await wait_for(
                lambda: (gw1.deliver_service.batches, gw2.deliver_service.batches) == (3, 3),
                "3 batches on each gateway",
            )
            assert await nothing_more(ann, 0.2) and await nothing_more(bob, 0.2)
