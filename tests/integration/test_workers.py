"""IMROUTE_WORKERS (push_service.workers): several push-service processes on one port,
as real processes, with a real gateway, Redis and WebSocket clients."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from router.devtools.ports import free_port
from router.devtools.supervisor import alive, descendants
from tests.conftest import API_KEY
from tests.integration.procs import BIN, Proc, base_env, read_until, running
from tests.integration.stack import AUTH, client, gateway

pytestmark = pytest.mark.integration


def _env(redis_url: str, prefix: str, tmp_path: Path, workers: int) -> dict[str, str]:
    return base_env(
        IMROUTE_REDIS_URL=redis_url,
        IMROUTE_REDIS_PREFIX=prefix,
        IMROUTE_API_KEY=API_KEY,
        IMROUTE_DB_URL=f"sqlite+aiosqlite:///{tmp_path}/users.db",
        IMROUTE_GATEWAY_CACHE_S="0",
        IMROUTE_WORKERS=str(workers),
        IMROUTE_LOG_LEVEL="info",
    )


@contextmanager
def push_service(env: dict[str, str], port: int) -> Iterator[Proc]:
    """Once the port takes connections (said before the workers start) and every worker
    has started (it answers /healthz)."""
    argv = [str(BIN / "python"), "-m", "push_service", "--port", str(port)]
    with running(argv, env) as proc:
        read_until(proc, "Uvicorn running on", timeout=60)
        read_until(proc, "Application startup complete", timeout=60)
        read_until(proc, "Application startup complete", timeout=60)
        yield proc


def _workers(proc: Proc) -> set[int]:
    return {p for p in descendants(proc.pid) if alive(p)}


def _per_worker(metrics: str, name: str) -> dict[str, float]:
    """The sum of a metric's samples per worker label."""
    sums: dict[str, float] = {}
    for line in metrics.splitlines():
        m = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if m:
            worker = re.search(r'worker="(\d+)"', m.group(1))
            assert worker is not None, line
            sums[worker.group(1)] = sums.get(worker.group(1), 0.0) + float(m.group(2))
    return sums


async def test_two_workers_share_the_port_and_both_push(
    redis_url: str, prefix: str, redis: object, tmp_path: Path
) -> None:
    port = free_port()
    env = _env(redis_url, prefix, tmp_path, workers=2)
    async with gateway(redis_url, prefix, "gw1", "g1") as gw, client(gw, "alice") as ws:
        with push_service(env, port) as proc:
            assert len(_workers(proc)) == 2
            base = f"http://127.0.0.1:{port}"
            # Many connections, so that both workers take some (each accepts as it can).
            clients = [httpx.AsyncClient(base_url=base, timeout=10) for _ in range(16)]
            try:
                answers = await asyncio.gather(
                    *(
                        clients[i % 16].post(
                            "/v1/push", json={"to": ["alice"], "content": i}, headers=AUTH
                        )
                        for i in range(200)
                    )
                )
                assert [a.status_code for a in answers] == [200] * 200
                got = sorted([json.loads(await ws.recv())["content"] for _ in range(200)])
                assert got == list(range(200))  # every push once, whichever worker sent it
                metrics = (await clients[0].get("/metrics")).text
            finally:
                for c in clients:
                    await c.aclose()
            calls = _per_worker(metrics, "imroute_gateway_call_attempts_total")
            assert set(calls) == {"0", "1"}, calls  # one scrape answers for both
            # (the coalescer carries many pushes in one call under load)
            assert 2 <= sum(calls.values()) <= 200
            assert all(n > 0 for n in calls.values()), calls


async def test_a_killed_worker_is_replaced_and_sigint_stops_them_all(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    port = free_port()
    env = _env(redis_url, prefix, tmp_path, workers=2)
    with push_service(env, port) as proc:
        first = _workers(proc)
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        read_until(proc, "starting it again", timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            now = _workers(proc)
            if len(now) == 2 and victim not in now:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"no replacement worker: {_workers(proc)}")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            for _ in range(20):  # whichever worker takes each connection answers
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as fresh:
                    assert (await fresh.get("/healthz")).status_code == 200
            assert (await http.get("/healthz")).status_code == 200
        workers = _workers(proc)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert not any(alive(p) for p in workers)


async def test_a_killed_supervisor_leaves_no_worker(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    port = free_port()
    env = _env(redis_url, prefix, tmp_path, workers=2)
    with push_service(env, port) as proc:
        workers = _workers(proc)
        assert len(workers) == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 15
        while any(alive(p) for p in workers) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not any(alive(p) for p in workers)


def test_a_bad_setting_is_one_message_and_exit_2(tmp_path: Path) -> None:
    env = base_env(IMROUTE_API_KEY=API_KEY, IMROUTE_WORKERS="0")
    with running([str(BIN / "python"), "-m", "push_service"], env) as proc:
        assert proc.wait(30) == 2
        out = "\n".join(read_until(proc, "IMROUTE_WORKERS"))
        assert "greater than or equal to 1" in out
