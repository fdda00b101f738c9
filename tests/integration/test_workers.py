"""IMROUTE_WORKERS (push_service.workers): several push-service processes on one port,
as real processes, with a real gateway, Redis and WebSocket clients."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import re
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from router.processes.ports import free_port
from router.processes.supervisor import alive, descendants
from tests.conftest import API_KEY
from tests.integration.procs import BIN, Proc, base_env, read_until, running, service_env
from tests.integration.stack import AUTH, client, gateway, recv_json
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


@asynccontextmanager
async def two_workers(
    redis_url: str, prefix: str, tmp_path: Path, **extra: str
) -> AsyncIterator[tuple[Proc, int]]:
    """A push service of two workers on a free port (its process and the port), with
    `extra` settings, once the port takes connections (said before the workers start)
    and every worker has started (it answers /healthz). Waited for in a thread: the loop
    goes on serving the in-process gateway meanwhile (blocked for a start-up, its fleet
    record lapsed)."""
    port = free_port()
    env = service_env(
        redis_url,
        prefix,
        tmp_path,
        IMROUTE_GATEWAY_CACHE_S="0",
        IMROUTE_WORKERS="2",
        IMROUTE_LOG_LEVEL="info",
        **extra,
    )
    argv = [str(BIN / "python"), "-m", "push_service", "--port", str(port)]
    with running(argv, env) as proc:
        for marker in ("Uvicorn running on", *["Application startup complete"] * 2):
            await asyncio.to_thread(read_until, proc, marker, 60)
        yield proc, port


def _output(proc: Proc) -> str:
    """The lines `proc` wrote that nobody has read yet."""
    assert proc.lines is not None
    lines: list[str] = []
    with contextlib.suppress(queue.Empty):
        while (line := proc.lines.get_nowait()) is not None:
            lines.append(line)
    return "\n".join(lines[-200:])


def _workers(proc: Proc) -> set[int]:
    return {p for p in descendants(proc.pid) if alive(p)}


def _sum(metrics: str, name: str) -> float:
    """The sum of a metric's samples in a scrape."""
    return sum(
        float(m.group(1))
        for line in metrics.splitlines()
        if (m := re.match(rf"{name}(?:\{{.*\}})? (\S+)$", line))
    )


def _cmdline(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


async def _own_scrapes(proc: Proc) -> dict[str, str]:
    """Each worker's own scrape, read from its metrics socket (what /metrics merges)."""
    out: dict[str, str] = {}
    for pid in _workers(proc):
        argv = _cmdline(pid)
        folder = argv[argv.index(b"--workers-dir") + 1].decode()
        index = argv[argv.index(b"--worker") + 1].decode()
        reader, writer = await asyncio.open_unix_connection(f"{folder}/{index}.sock")
        out[index] = (await reader.read()).decode()
        writer.close()
    return out


@pytest.mark.usefixtures("redis")
async def test_two_workers_share_the_port_and_both_push(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    # A 5-s heartbeat (a 15-s fleet record): under a whole suite's load, this test's
    # process can miss the default 6 s, and pushes then answer "offline" correctly.
    async with (
        gateway(redis_url, prefix, "gw1", "g1", heartbeat_s=5.0) as gw,
        client(gw, "alice") as ws,
    ):
        async with two_workers(redis_url, prefix, tmp_path) as (proc, port):
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
                undelivered = [a.json() for a in answers if a.json()["delivered"] != ["alice"]]
                assert not undelivered, undelivered[:3]
                got = sorted([(await recv_json(ws, 10))["content"] for _ in range(200)])
                assert got == list(range(200))  # every push once, whichever worker sent it
                metrics = (await clients[0].get("/metrics")).text
                own = await _own_scrapes(proc)
            finally:
                for c in clients:
                    await c.aclose()
            name = "imroute_gateway_call_attempts_total"
            calls = {worker: _sum(text, name) for worker, text in own.items()}
            assert set(calls) == {"0", "1"}, calls
            assert all(n > 0 for n in calls.values()), calls  # both workers pushed
            # One scrape answers for the service: the workers' counts, summed (the
            # coalescer carries many pushes in one call under load).
            assert _sum(metrics, name) == sum(calls.values())
            assert 2 <= sum(calls.values()) <= 200


async def test_a_killed_worker_is_replaced_and_sigint_stops_them_all(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    async with two_workers(redis_url, prefix, tmp_path) as (proc, port):
        first = _workers(proc)
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        read_until(proc, "starting it again", timeout=10)
        await wait_for(
            lambda: len(now := _workers(proc)) == 2 and victim not in now,
            "a replacement worker",
            30,
            every=0.1,
            detail=lambda: f"workers {_workers(proc)}",
        )
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            for _ in range(20):  # whichever worker takes each connection answers
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as fresh:
                    assert (await fresh.get("/healthz")).status_code == 200
            assert (await http.get("/healthz")).status_code == 200
        workers = _workers(proc)
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            # Seen once in a while in CI, never alone: say who is left and what was said.
            left = sorted(p for p in workers | _workers(proc) if alive(p))
            pytest.fail(
                f"still running 30 s after SIGINT: workers {left} of {sorted(workers)} (the "
                f"replacement of {victim}); output since the restart:\n{_output(proc)}"
            )
        assert code == 0
        assert not any(alive(p) for p in workers)


async def test_a_killed_supervisor_leaves_no_worker(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    async with two_workers(redis_url, prefix, tmp_path) as (proc, _):
        workers = _workers(proc)
        assert len(workers) == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        await wait_for(lambda: not any(alive(p) for p in workers), "no worker left", 15, every=0.1)


async def test_a_request_never_finished_does_not_hold_a_stopping_worker_for_ever(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """The supervisor killed (its workers get SIGTERM from the kernel) while a client
    trickles a body that never ends: each worker cuts it after its requests' grace and
    exits. Before, uvicorn waited for it for ever: a worker outlived `imroute dev` and
    held the port."""
    extra = {"IMROUTE_DELIVER_TIMEOUT_S": "0.5", "IMROUTE_JOB_SHUTDOWN_GRACE_S": "0"}
    async with two_workers(redis_url, prefix, tmp_path, **extra) as (proc, port):
        workers = _workers(proc)
        held = []
        for _ in range(4):  # the kernel spreads them over both workers' accepts
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Authorization: Bearer {API_KEY}\r\n".encode()
                + b"Content-Length: 100000\r\n\r\n{"
            )
            held.append(writer)

        async def trickle() -> None:
            while True:
                await asyncio.sleep(1.0)
                for writer in held:
                    with contextlib.suppress(OSError):
                        writer.write(b" ")

        trickling = asyncio.ensure_future(trickle())
        try:
            await asyncio.sleep(0.5)
            started = time.monotonic()
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            # 0.5 s deliver timeout + 5 s margin + 10 s of wait_ack_ms + 1 s: 17 s.
            await wait_for(
                lambda: not any(alive(p) for p in workers), "workers gone", 30, every=0.2
            )
            assert time.monotonic() - started < 25
        finally:
            trickling.cancel()
            for writer in held:
                writer.close()


def test_a_bad_setting_is_one_message_and_exit_2(tmp_path: Path) -> None:
    env = base_env(IMROUTE_API_KEY=API_KEY, IMROUTE_WORKERS="0")
    with running([str(BIN / "python"), "-m", "push_service"], env) as proc:
        assert proc.wait(30) == 2
        out = "\n".join(read_until(proc, "IMROUTE_WORKERS"))
        assert "greater than or equal to 1" in out


@pytest.mark.usefixtures("redis")
async def test_jobs_keys_and_limits_hold_across_workers(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """What workers share lives in Redis: an Idempotency-Key sent to both gives one push,
    a broadcast job runs to done, and the rate limit is one bucket, not one per worker."""
    async with gateway(redis_url, prefix, "gw1", "g1") as gw, client(gw, "alice") as ws:
        async with two_workers(
            redis_url, prefix, tmp_path, IMROUTE_RATE_LIMIT="50/s", IMROUTE_RATE_BURST="10"
        ) as (_, port):
            base = f"http://127.0.0.1:{port}"
            clients = [httpx.AsyncClient(base_url=base, timeout=10) for _ in range(10)]
            try:
                headers = {**AUTH, "Idempotency-Key": "one-push"}
                body = {"to": ["alice"], "content": "once"}
                same = await asyncio.gather(
                    *(c.post("/v1/push", json=body, headers=headers) for c in clients)
                )
                assert {r.status_code for r in same} == {200}, [r.text for r in same]
                assert len({r.json()["push_id"] for r in same}) == 1
                assert (await recv_json(ws, 10))["content"] == "once"
                await asyncio.sleep(1.0)  # the bucket refills (10 requests took it)
                job = await clients[0].post(
                    "/v1/broadcast", json={"content": "all", "audience": {"online": True}},
                    headers=AUTH,
                )  # fmt: skip
                assert job.status_code == 202, job.text
                assert (await recv_json(ws, 10))["content"] == "all"
                for _ in range(100):
                    status = (
                        await clients[1].get(f"/v1/pushes/{job.json()['push_id']}", headers=AUTH)
                    ).json()
                    if status["status"] == "done":
                        break
                    await asyncio.sleep(0.05)
                assert status["status"] == "done", status
                await asyncio.sleep(1.0)
                started = time.monotonic()
                answers = await asyncio.gather(
                    *(
                        clients[i % 10].post(
                            "/v1/push",
                            json={"to": ["nobody"], "content": i, "store": False},
                            headers=AUTH,
                        )
                        for i in range(200)
                    )
                )
                elapsed = time.monotonic() - started
            finally:
                for c in clients:
                    await c.aclose()
    passed = sum(a.status_code == 200 for a in answers)
    assert {a.status_code for a in answers} <= {200, 429}
    # One bucket: about 50/s plus the burst; one per worker would pass about twice that.
    assert 5 <= passed <= 50 * elapsed + 10 + 15, (passed, elapsed)
