"""Redis goes away under a running stack: the push API and dispatch answer 503 at once
(a hung Redis within IMROUTE_REDIS_TIMEOUT_S), the gateway keeps its clients and keeps
taking gRPC deliveries, and once a Redis with an empty dataset is back at the same
address, every route returns within 5 s and P2P works again. A redis-server of the
test's own, on a TCP port, so that it can be paused, killed and restarted."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import pytest
import redis.asyncio as aioredis

from router.gateway_rpc.client import GrpcGatewayClients
from router.testing import deliver_one
from shared.batches import to_batch
from shared.clock import SystemClock
from shared.keys import KeySchema
from shared.models import Message
from tests.integration.redis_process import redis_process
from tests.integration.stack import AUTH, api, client, gateway, recv_json, token

pytestmark = pytest.mark.integration

TIMEOUT_S = 0.5  # IMROUTE_REDIS_TIMEOUT_S for this test: a hung Redis costs this much


async def timed_push(
    http: object, uid: str, content: object
) -> tuple[int, dict[str, object], float]:
    started = time.monotonic()
    resp = await http.post(  # type: ignore[attr-defined]
        "/v1/push", json={"to": [uid], "content": content}, headers=AUTH
    )
    return resp.status_code, resp.json(), time.monotonic() - started


async def test_redis_down_means_503s_not_hangs_and_the_gateway_keeps_delivering(
    prefix: str,
) -> None:
    opts: dict[str, Any] = {"redis_timeout_s": TIMEOUT_S}
    with redis_process() as server:
        async with (
            gateway(server.url, prefix, "gw1", "g1", heartbeat_s=0.3, **opts) as gw,
            api(server.url, prefix, **opts) as http,
            client(gw, "amy") as ws,
        ):
            status, body, _ = await timed_push(http, "amy", "before")
            assert status == 200 and body["delivered"] == ["amy"]
            assert (await recv_json(ws))["content"] == "before"
            dispatch_headers = {"Authorization": f"Bearer {token('amy')}"}

            # A hung Redis (paused: it accepts nothing and answers nothing).
            server.signal(signal.SIGSTOP)
            status, body, elapsed = await timed_push(http, "amy", "hung")
            assert status == 503, body
            assert "redis" in str(body).lower()
            assert elapsed < TIMEOUT_S + 1.5, f"push took {elapsed:.2f}s"
            started = time.monotonic()
            resp = await http.get("/v1/dispatch", headers=dispatch_headers)
            assert resp.status_code == 503 and int(resp.headers["Retry-After"]) >= 1
            assert time.monotonic() - started < TIMEOUT_S + 1.5
            # The gateway still holds its client and still takes gRPC deliveries.
            direct, address = GrpcGatewayClients(), f"127.0.0.1:{gw.grpc_port}"
            try:
                message = Message("m1", "p1", 0, "admin", b'"direct"', SystemClock().now_ms())
                batch = to_batch(message, ["amy"], "b1")
                reply = await deliver_one(direct, "gw1", address, batch, 2.0)
                assert list(reply.delivered) == ["amy"]
                assert (await recv_json(ws))["content"] == "direct"

                # Redis gone (connection refused): 503 straight away.
                server.kill()
                status, body, elapsed = await timed_push(http, "amy", "down")
                assert status == 503 and elapsed < 1.0, (status, elapsed)
                # A batch: one answer per message, each the 503 a single push gets; none
                # of them is sent (the next frame amy gets is the direct call's).
                messages = [{"to": ["amy"], "content": f"batch-{n}"} for n in range(3)]
                resp = await http.post("/v1/push/batch", json={"messages": messages}, headers=AUTH)
                assert resp.status_code == 200, resp.text
                results = resp.json()["results"]
                assert [r["status"] for r in results] == [503, 503, 503], results
                assert all("redis" in str(r).lower() for r in results), results
                batch = to_batch(message, ["amy"], "b2")
                reply = await deliver_one(direct, "gw1", address, batch, 2.0)
                assert list(reply.delivered) == ["amy"]
                assert (await recv_json(ws))["content"] == "direct"
            finally:
                await direct.close()

            # Back, empty: the gateway re-registers amy and itself within 5 s.
            server.start()
            keys = KeySchema(prefix)
            fresh = aioredis.Redis.from_url(server.url)
            try:
                started = time.monotonic()
                while await fresh.exists(keys.route("amy"), keys.gateway("gw1")) != 2:
                    assert time.monotonic() - started < 5, "amy's route did not come back in 5 s"
                    await asyncio.sleep(0.05)
            finally:
                await fresh.aclose()
            status, body, _ = await timed_push(http, "amy", "after")
            assert status == 200 and body["delivered"] == ["amy"], body
            assert (await recv_json(ws))["content"] == "after"
            resp = await http.get("/v1/dispatch", headers=dispatch_headers)
            assert resp.status_code == 200 and resp.json()["gateway_id"] == "gw1"
