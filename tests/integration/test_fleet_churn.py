"""Gateways come and go: the push service closes the gRPC channel, drops the coalescing
lane and forgets the circuit stats of a gateway that left the fleet, and a gateway that
comes back is reached afresh. Real Redis, real gRPC."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import redis.asyncio as aioredis

from shared.keys import KeySchema
from socket_gateway.faults import DelayCalls
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
        parts = http._transport.app.state.parts  # type: ignore[attr-defined]
        services = http._transport.app.state.services  # type: ignore[attr-defined]
        coalescing = parts.gateway_clients
        # The stack P2P pushes use.
        assert services.pushes._pusher._deliver_each == coalescing.deliver_each
        grpc_clients = parts.grpc_clients
        stats = parts.call_stats  # the circuits P2P calls and dispatch share

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
            assert "gw2" in stats
            assert 'gateway="gw2"' in (await http.get("/metrics")).text
            channel = grpc_clients._stubs[f"127.0.0.1:{gw2.grpc_port}"].channel
        # gw2 stopped (its fleet record withdrawn); the next push reads the fleet.
        body = await push(["ann", "bob"], 2)
        assert body["delivered"] == ["ann"]
        assert (await recv_json(ann))["content"] == 1
        assert (await recv_json(ann))["content"] == 2
        assert len(grpc_clients) == 1 and len(coalescing) == 1
        assert "gw2" not in stats and "gw1" in stats
        scrape = (await http.get("/metrics")).text
        assert 'gateway="gw2"' not in scrape and 'gateway="gw1"' in scrape  # series dropped
        # Its channel was closed, not just dropped (nothing was in flight on it).
        for _ in range(100):
            if channel.get_state() is grpc.ChannelConnectivity.SHUTDOWN:
                break
            await asyncio.sleep(0.05)
        assert channel.get_state() is grpc.ChannelConnectivity.SHUTDOWN

        # gw2 is back (on a port of its own again): reached through a new channel.
        async with (
            gateway(redis_url, prefix, "gw2", "g1", heartbeat_s=0.2) as gw2,
            client(gw2, "bob") as bob,
        ):
            body = await push(["bob"], 3)
            assert body["delivered"] == ["bob"], body
            assert (await recv_json(bob))["content"] == 3
            assert len(grpc_clients) == 2


async def test_a_call_in_flight_when_its_gateway_drops_out_still_completes(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    keys = KeySchema(prefix)
    slow = DelayCalls(0.0)
    async with (
        gateway(redis_url, prefix, "gw1", "g1", heartbeat_s=5) as gw1,
        gateway(redis_url, prefix, "gw2", "g1", heartbeat_s=5, interceptors=[slow]) as gw2,
        api(redis_url, prefix) as http,
        client(gw1, "ann"),
        client(gw2, "bob") as bob,
    ):
        push = {"to": ["bob"], "content": "slow"}
        slow.seconds = 0.5
        in_flight = asyncio.create_task(http.post("/v1/push", json=push, headers=AUTH))
        await asyncio.sleep(0.2)
        # gw2's record lapses (as after missed heartbeats) while the call is on its way;
        # the next push reads the fleet and lets go of gw2's channel.
        await redis.zrem(keys.gateways(), "gw2")
        await redis.delete(keys.gateway("gw2"))
        other = await http.post("/v1/push", json={"to": ["ann"], "content": 1}, headers=AUTH)
        assert other.json()["delivered"] == ["ann"]
        body = (await in_flight).json()
        assert body["delivered"] == ["bob"], body  # the channel's grace let it finish
        assert (await recv_json(bob))["content"] == "slow"
