"""Gateways come and go: the push service closes the gRPC channel, drops the coalescing
lane and forgets the circuit stats of a gateway that left the fleet, and a gateway that
comes back is reached afresh. Real Redis, real gRPC."""

from __future__ import annotations

import pytest

from tests.integration.stack import AUTH, api, client, gateway, recv_json

pytestmark = pytest.mark.integration


async def test_a_departed_gateway_leaves_no_channel_lane_or_stats_behind(
    redis_url: str, prefix: str
) -> None:
    async with (
        gateway(redis_url, prefix, "gw1", "g1", heartbeat_s=0.2) as gw1,
        api(redis_url, prefix) as http,
        client(gw1, "ann") as ann,
    ):
        resilient = http._transport.app.state.services.pusher._clients  # type: ignore[attr-defined]
        coalescing = resilient._inner
        grpc_clients = coalescing._inner

        async def push(to: list[str], content: object) -> dict[str, object]:
            resp = await http.post("/v1/push", json={"to": to, "content": content}, headers=AUTH)
            assert resp.status_code == 200, resp.text
            body: dict[str, object] = resp.json()
            return body

        async with (
            gateway(redis_url, prefix, "gw2", "g1", heartbeat_s=0.2) as gw2,
            client(gw2, "bob") as bob,
        ):
            body = await push(["ann", "bob"], 1)
            assert sorted(body["delivered"]) == ["ann", "bob"]  # type: ignore[arg-type]
            assert (await recv_json(bob))["content"] == 1
            assert len(grpc_clients) == 2 and len(coalescing) == 2
            assert "gw2" in resilient.stats
        # gw2 stopped (its fleet record withdrawn); the next push reads the fleet.
        body = await push(["ann", "bob"], 2)
        assert body["delivered"] == ["ann"]
        assert (await recv_json(ann))["content"] == 1
        assert (await recv_json(ann))["content"] == 2
        assert len(grpc_clients) == 1 and len(coalescing) == 1
        assert "gw2" not in resilient.stats and "gw1" in resilient.stats

        # gw2 is back (on a port of its own again): reached through a new channel.
        async with (
            gateway(redis_url, prefix, "gw2", "g1", heartbeat_s=0.2) as gw2,
            client(gw2, "bob") as bob,
        ):
            body = await push(["bob"], 3)
            assert body["delivered"] == ["bob"], body
            assert (await recv_json(bob))["content"] == 3
            assert len(grpc_clients) == 2
