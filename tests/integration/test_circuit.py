"""P2P calls to a gateway that went away: retried on it, then its circuit opens and pushes
fail fast; once it is back, a probe closes the circuit. Real Redis, real gRPC, and a real
gateway process killed with SIGKILL."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import connect

from router.balancing import BreakerState
from router.fleet.store import RedisGatewayFleet
from router.processes.ports import free_port_block
from router.routes.registry import RedisRouteRegistry, Registration
from shared.clock import SystemClock
from shared.keys import KeySchema
from shared.models import GatewayInfo
from tests.integration.procs import BIN, Proc, gateway_env, running, ws_url_of
from tests.integration.stack import AUTH, api, client, gateway, ready, recv_json, token
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


async def test_a_dead_gateway_trips_its_circuit_and_a_probe_closes_it(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    keys, clock = KeySchema(prefix), SystemClock()
    port = free_port_block([0])
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
        parts = http._transport.app.state.parts  # type: ignore[attr-defined]
        stats = parts.call_stats  # shared with dispatch
        first, _ = await push(http)
        assert first["failed"] == ["zed"]
        assert first["errors"][0]["error"].startswith("UNAVAILABLE")
        assert stats.stats("gw1").failures == 2  # the call and its retry on the same gateway
        scrape = (await http.get("/metrics")).text
        assert 'imroute_gateway_call_attempts_total{gateway="gw1",outcome="failure"} 2.0' in scrape
        assert 'imroute_gateway_call_retries_total{gateway="gw1"} 1.0' in scrape
        second, _ = await push(http)  # its first call fails a third time: open
        assert stats.breaker("gw1").state is BreakerState.OPEN
        # The failure that opened it is what the push reports; no retry into the open circuit.
        assert second["errors"][0]["error"].startswith("UNAVAILABLE")
        assert stats.stats("gw1").failures == 3
        fast, elapsed = await push(http)
        assert fast["failed"] == ["zed"] and "circuit open" in fast["errors"][0]["error"]
        assert elapsed < 1.0  # no call was made (the failure count below proves it)
        assert stats.stats("gw1").failures == 3  # unchanged: no call was made

        # The gateway comes back at the same address (a new start in the fleet): the
        # circuit's cool-off is cut short, a probe goes through and closes it. zed's
        # three failed pushes waited in its inbox and came with its first frames.
        async with gateway(redis_url, prefix, "gw1", "g1", grpc_port=port) as gw:
            async with client(gw, "zed") as ws:
                await wait_for(
                    lambda: stats.breaker("gw1").state is not BreakerState.OPEN,
                    "the circuit to let a probe through",
                    1.2,
                )
                # The one probe may be a background retry of a queued push: until it
                # closes the circuit, a push is still refused fast.
                for _ in range(30):
                    back, _ = await push(http)
                    if back["delivered"]:
                        break
                    assert "circuit open" in back["errors"][0]["error"], back
                    await asyncio.sleep(0.1)
                assert back["delivered"] == ["zed"], (back["failed"], back["errors"])
                assert (await recv_json(ws))["content"] == 1
                assert stats.breaker("gw1").state is BreakerState.CLOSED


async def test_a_sigkilled_gateway_process_fails_fast_and_closes_its_circuit_when_back(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    port = free_port_block([0])
    env = gateway_env(redis_url, prefix)
    # A heartbeat of 5 s keeps the dead gateway in the fleet for 10-15 s: long enough for
    # pushes to try it, as they would in the seconds after a real crash.
    argv = [str(BIN / "imroute"), "gateway", "--id", "gwk", "--group", "g1",
            "--ws-port", "0", "--grpc-port", str(port), "--heartbeat", "5"]  # fmt: skip
    keys = KeySchema(prefix)

    async def connect_kim(proc: Proc) -> Any:
        ws = await connect(f"{await ws_url_of(proc)}?token={token('kim')}")
        await ready(ws)
        await wait_for(lambda: redis.hlen(keys.route("kim")), "kim's route", 4.0, every=0.02)
        return ws

    async def push(http: Any, n: int) -> tuple[dict[str, Any], float]:
        started = time.monotonic()
        resp = await http.post("/v1/push", json={"to": ["kim"], "content": n}, headers=AUTH)
        assert resp.status_code == 200, resp.text
        return resp.json(), time.monotonic() - started

    async def dispatched(http: Any, n: int) -> set[str]:
        chosen = set()
        for i in range(n):
            headers = {"Authorization": f"Bearer {token(f'd{i}')}"}
            resp = await http.get("/v1/dispatch", headers=headers)
            assert resp.status_code == 200, resp.text
            chosen.add(resp.json()["gateway_id"])
        return chosen

    settings: dict[str, Any] = {
        "circuit_failures": 3,
        "circuit_cool_off_s": 3.0,  # what follows the opening must fit in it
        "dispatch_rule": "round_robin",
        "gateway_cache_s": 1.0,  # as in production: fleet reads are counted below
    }
    async with (
        api(redis_url, prefix, **settings) as http,
        gateway(redis_url, prefix, "gw2", "g1", heartbeat_s=0.5),
    ):
        parts = http._transport.app.state.parts  # type: ignore[attr-defined]
        stats = parts.call_stats  # shared with dispatch
        with running(argv, env) as proc:
            ws = await connect_kim(proc)
            assert await dispatched(http, 4) == {"gwk", "gw2"}
            body, _ = await push(http, 0)
            assert body["delivered"] == ["kim"]
            assert (await recv_json(ws))["content"] == 0
            proc.send_signal(signal.SIGKILL)
            proc.wait(5)
            await ws.close()

        errors: list[str] = []
        for n in range(1, 4):  # 2 calls each (a retry on the same gateway): open by the 2nd
            body, elapsed = await push(http, n)
            assert body["failed"] == ["kim"] and body["delivered"] == [], body
            assert elapsed < 1.0, f"push {n} took {elapsed:.2f}s to report the dead gateway"
            errors.append(body["errors"][0]["error"])
        assert errors[0].startswith("UNAVAILABLE"), errors
        assert "circuit open" in errors[-1], errors
        assert stats.breaker("gwk").state is BreakerState.OPEN
        # Still in the fleet (its record has not lapsed), but dispatch skips it.
        assert await redis.exists(keys.gateway("gwk")) == 1
        assert await dispatched(http, 6) == {"gw2"}
        failures = stats.stats("gwk").failures
        fleet = http._transport.app.state.parts.fleet  # type: ignore[attr-defined]
        reads = fleet.reads
        for n in range(4, 9):
            body, elapsed = await push(http, n)
            assert "circuit open" in body["errors"][0]["error"] and elapsed < 1.0
        assert stats.stats("gwk").failures == failures  # failed fast: no call was made
        assert fleet.reads - reads <= 1  # and a refusal is no reason to re-read the fleet

        # Restarted at the same address: its new start cuts the cool-off short, and a
        # probe closes the circuit. The failed pushes waited in kim's inbox (its replay).
        with running(argv, env) as proc:
            ws = await connect_kim(proc)
            await wait_for(lambda: stats.breaker("gwk").state is not BreakerState.OPEN,
                           "the probe", timeout=5)  # fmt: skip
            for _ in range(30):  # the one probe may be a background retry: see above
                body, _ = await push(http, 9)
                if body["delivered"]:
                    break
                assert "circuit open" in body["errors"][0]["error"], body
                await asyncio.sleep(0.1)
            assert body["delivered"] == ["kim"], body
            assert (await recv_json(ws))["content"] == 9
            assert stats.breaker("gwk").state is BreakerState.CLOSED
            await ws.close()
