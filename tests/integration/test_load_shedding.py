"""Load shedding (push_service.admission) on a real push service process driven past its
bound: the requests past it are answered 503 overloaded at once, with Retry-After and
JSON, and do nothing; the admitted ones finish; /healthz, /metrics and the dashboard's
read answer meanwhile. The lag rule in process, on the test's own loop."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.processes.ports import free_port
from tests.integration.procs import BIN, Proc, read_until, running, service_env
from tests.integration.stack import AUTH, api, client, gateway, nothing_more, recv_json

pytestmark = pytest.mark.integration

HOLD_MS = 1500  # each admitted push waits this long for an ack that never comes


@asynccontextmanager
async def _push_service(env: dict[str, str], port: int) -> AsyncIterator[Proc]:
    argv = [str(BIN / "python"), "-m", "push_service", "--port", str(port)]
    with running(argv, env) as proc:
        # In a thread: the in-process gateway's loop goes on meanwhile.
        await asyncio.to_thread(read_until, proc, "Application startup complete", 60)
        yield proc


async def _timed(call: Any) -> tuple[httpx.Response, float]:
    began = time.monotonic()
    answer = await call
    return answer, time.monotonic() - began


@pytest.mark.usefixtures("redis")
async def test_past_its_bound_a_push_service_sheds_at_once_and_the_operator_is_answered(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    port = free_port()
    env = service_env(
        redis_url, prefix, tmp_path, IMROUTE_GATEWAY_CACHE_S="0", IMROUTE_HTTP_MAX_IN_FLIGHT="6"
    )
    async with (
        gateway(redis_url, prefix, "gw1", "g1", heartbeat_s=5.0) as gw,
        client(gw, "alice") as ws,
        _push_service(env, port),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http,
    ):

        def push(i: int) -> Any:
            body = {"to": ["alice"], "content": i, "wait_ack_ms": HOLD_MS}
            return _timed(http.post("/v1/push", json=body, headers=AUTH))

        async def operator() -> list[tuple[httpx.Response, float]]:
            await asyncio.sleep(0.4)  # while the admitted pushes hold their places
            return [
                await _timed(http.get("/healthz")),
                await _timed(http.get("/metrics")),
                await _timed(http.get("/v1/admin/overview", headers=AUTH)),
                await _timed(http.get("/dashboard/")),
            ]

        *pushes, seen = await asyncio.gather(*(push(i) for i in range(40)), operator())

        shed = [(a, took) for a, took in pushes if a.status_code == 503]
        done = [(a, took) for a, took in pushes if a.status_code == 200]
        assert len(shed) + len(done) == 40, [a.status_code for a, _ in pushes]
        assert len(shed) >= 20 and len(done) >= 6, (len(shed), len(done))
        for answer, took in shed:
            assert answer.json()["error"] == "overloaded", answer.text
            assert "IMROUTE_HTTP_MAX_IN_FLIGHT" in answer.json()["detail"]
            assert answer.headers["retry-after"] == "1"
            assert answer.headers.get("connection") != "close"  # a small body: kept
            assert took < 1.0, took  # at once, not after a place came free
        for _, took in done:
            assert took < HOLD_MS / 1000 + 3, took
        for answer, took in seen:  # never shed, and not queued behind the pushes
            assert answer.status_code == 200, (answer.request.url, answer.text)
            assert took < 1.0, (answer.request.url, took)
        scrape = seen[1][0].text
        counted = re.search(r'imroute_http_shed_total\{reason="in_flight"\} (\S+)', scrape)
        assert counted and float(counted.group(1)) >= len(shed) - 5, scrape  # mid-load

        # A shed push did nothing: alice got exactly the admitted ones.
        got = sorted([(await recv_json(ws, 10))["content"] for _ in done])
        assert got == sorted(json.loads(a.request.content)["content"] for a, _ in done)
        assert await nothing_more(ws, 0.5)


async def test_a_stalled_loop_with_requests_in_flight_sheds_new_ones(
    redis_url: str, prefix: str
) -> None:
    async with (
        gateway(redis_url, prefix, "gw1", "g1") as gw,
        client(gw, "alice"),
        api(redis_url, prefix, http_max_lag_ms=200) as http,
    ):
        body = {"to": ["alice"], "content": 1, "wait_ack_ms": 3000}
        holding = [
            asyncio.create_task(http.post("/v1/push", json=body, headers=AUTH)) for _ in range(8)
        ]
        await asyncio.sleep(0.5)  # all 8 in flight, waiting for acks
        time.sleep(0.5)  # the loop is stuck (a CPU-bound burst): the lag task is overdue
        answer = await http.post("/v1/push", json=body, headers=AUTH)
        assert answer.status_code == 503, answer.text
        assert "IMROUTE_HTTP_MAX_LAG_MS" in answer.json()["detail"]
        health = await http.get("/healthz")
        assert health.status_code == 200  # the operator's is never shed
        assert all(a.status_code == 200 for a in await asyncio.gather(*holding))
