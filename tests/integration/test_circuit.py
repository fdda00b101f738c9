"""P2P calls to a gateway that went away: retried on it, then its circuit opens and pushes
fail fast; once it is back, a probe closes the circuit. Real Redis, real gRPC."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import pytest
import redis.asyncio as aioredis

from router.balancing import BreakerState
from router.fleet import RedisGatewayFleet
from router.registry import RedisRouteRegistry, Registration
from shared.clock import SystemClock
from shared.keys import KeySchema
from shared.models import GatewayInfo
from tests.integration.stack import AUTH, api, client, gateway, recv_json

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_a_dead_gateway_trips_its_circuit_and_a_probe_closes_it(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    keys, clock = KeySchema(prefix), SystemClock()
    port = free_port()
    # A gateway killed a moment ago: its fleet record and a user's route remain, but
    # nothing listens at its address any more.
    fleet = RedisGatewayFleet(redis, keys, clock, ttl_s=30)  # type: ignore[arg-type]
    await fleet.announce(
        GatewayInfo("gw1", "g1", "ws://x/ws", f"127.0.0.1:{port}", 1, clock.now_ms())
    )
    registry = RedisRouteRegistry(redis, keys, clock, gateway_id="gw1", group_id="g1",
                                  ip="127.0.0.1", port=port)  # fmt: skip
    await registry.refresh([Registration("zed", "gw1.dead.1")])
    settings: dict[str, Any] = {"circuit_failures": 3, "circuit_cool_off_s": 1.2}

    async def push(http: Any) -> tuple[dict[str, Any], float]:
        started = time.monotonic()
        resp = await http.post("/v1/push", json={"to": ["zed"], "content": 1}, headers=AUTH)
        assert resp.status_code == 200, resp.text
        return resp.json(), time.monotonic() - started

    async with api(redis_url, prefix, **settings) as http:
        stats = http._transport.app.state.services.pusher._clients.stats  # type: ignore[attr-defined]
        first, _ = await push(http)
        assert first["failed"] == ["zed"]
        assert first["errors"][0]["error"].startswith("UNAVAILABLE")
        assert stats.stats("gw1").failures == 2  # the call and its retry on the same gateway
        scrape = (await http.get("/metrics")).text
        assert (
            'imroute_gateway_call_attempts_total{gateway="gw1",outcome="failure"} 2.0' in scrape
        )
        assert 'imroute_gateway_call_retries_total{gateway="gw1"} 1.0' in scrape
        second, _ = await push(http)  # its first call fails a third time: open
        assert stats.breaker("gw1").state is BreakerState.OPEN
        assert "circuit open" in second["errors"][0]["error"]  # so its retry was refused
        assert stats.stats("gw1").failures == 3
        fast, elapsed = await push(http)
        assert fast["failed"] == ["zed"] and "circuit open" in fast["errors"][0]["error"]
        assert elapsed < 0.2  # no call was made
        assert stats.stats("gw1").failures == 3  # unchanged: no call was made

        # The gateway comes back at the same address; after the cool-off, a probe goes
        # through and closes the circuit.
        async with gateway(redis_url, prefix, "gw1", "g1", grpc_port=port) as gw:
            async with client(gw, "zed") as ws:
                await asyncio.sleep(1.2)
                assert stats.breaker("gw1").state is BreakerState.HALF_OPEN
                back, _ = await push(http)
                assert back["delivered"] == ["zed"], (back["failed"], back["errors"])
                assert (await recv_json(ws))["content"] == 1
                assert stats.breaker("gw1").state is BreakerState.CLOSED
