"""Resume storm: N clients lose their gateway (SIGKILL) and all resume at once elsewhere.

Starts the push service and two gateways of one group (gw1, gw2) as child processes, and
one client process that connects N clients to gw1. Each client gets one push (so it has a
`pos`), then gw1 is SIGKILLed and every client misses M messages: M/2 P2P messages each
(logged and queued as the push service does for an offline user, written straight into
the recovery store to keep the setup short) and M/2 fan-out messages through the REST
API (online broadcasts and multicasts to all N, alternating). Then every client
reconnects to gw2 with `since=<its pos>` at once. Reported: the time from the resume
until the last client has its `recovered` frame (and per-client percentiles), whether
each client got exactly its M messages in order with `complete: true`, and the CPU of
Redis and gw2 during the storm.

    .venv/bin/python -m bench.resume_storm --quick
    .venv/bin/python -m bench.resume_storm --clients 5000 --missed 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import httpx

from bench.harness.cli import add_run_flags, in_range, parse_run_args
from bench.harness.clients import ClientPool, indices_of, token_url, uid_of
from bench.harness.link import ChildLink, emit, stdin_commands
from bench.harness.report import machine_lines, print_json
from bench.harness.stack import BenchError, Harness, Service, run_async, run_main, start_service
from bench.harness.stats import cpu_snapshot, spread
from bench.harness.workers import add_worker_flag, serve_worker, spawn_worker
from router.processes.supervisor import Child
from router.recovery.base import RecoveryLimits
from router.recovery.store import RedisRecoveryStore
from router.redis.client import connect_redis
from shared.clock import SystemClock
from shared.models import Message

OVERALL_TIMEOUT_S = 280.0
STORM_PARALLEL = 1000  # handshakes in flight in the client process: "at once"


# --------------------------------------------------------------------------- client process


async def _worker(spec: dict[str, Any]) -> None:
    secret = os.environ["IMROUTE_SECRET"]
    ks = list(indices_of(spec))
    pos: dict[int, str] = {}
    got: dict[int, list[Any]] = {k: [] for k in ks}  # contents after the first push
    done: dict[int, tuple[float, dict[str, Any]]] = {}  # resumed: arrival of `recovered`
    all_done = asyncio.Event()
    recovered_flags = {"missing": 0}
    pools: list[ClientPool] = []

    # Frames that came in with the handshake's answer, before the pool knew whose
    # connection it is: handled once it does.
    orphans: dict[object, list[tuple[float, bytes]]] = {}

    def on_frame(conn: object, now: float, data: bytes) -> None:
        k = pools[-1].owner.get(conn)  # type: ignore[call-overload]
        if k is None:
            orphans.setdefault(conn, []).append((now, data))
            return
        handle(k, now, data)

    async def adopt() -> None:
        while True:
            await asyncio.sleep(0.02)
            for conn in list(orphans):
                k = pools[-1].owner.get(conn)  # type: ignore[call-overload]
                if k is not None:
                    for now, data in orphans.pop(conn):
                        handle(k, now, data)

    def handle(k: int, now: float, data: bytes) -> None:
        frame = json.loads(data)
        if frame["type"] == "recovered":
            if len(pools) == 2:
                done[k] = (now, frame)
                if len(done) == len(ks):
                    all_done.set()
            return
        pos[k] = frame["pos"]
        if len(pools) == 2:
            got[k].append(frame["content"])
            if not frame.get("recovered") and k not in done:
                recovered_flags["missing"] += 1  # a live frame before the replay ended

    adopting = asyncio.create_task(adopt())
    async for cmd in stdin_commands():
        if cmd["cmd"] == "connect":
            pools.append(ClientPool(ks, lambda k: token_url(spec["urls"][0], k, secret), on_frame))
            failed = await pools[-1].start()
            emit(event="connected", failed=failed)
        elif cmd["cmd"] == "positions":
            emit(event="positions", n=len(pos))
        elif cmd["cmd"] == "resume":
            pools.append(
                ClientPool(
                    ks,
                    lambda k: f"{token_url(spec['urls'][1], k, secret)}&since={pos[k]}",
                    on_frame,
                    parallel=STORM_PARALLEL,
                )
            )
            t0 = time.monotonic()
            failed = await pools[-1].start()
            if not failed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(all_done.wait(), cmd["timeout_s"])
            await asyncio.sleep(0.5)  # anything after the recovered frames
            emit(
                event="resumed",
                t0=t0,
                failed=failed,
                done={str(k): [t - t0, f] for k, (t, f) in done.items()},
                got={str(k): v for k, v in got.items()},
                early_live=recovered_flags["missing"],
                pool=pools[-1].stats,
            )
        elif cmd["cmd"] == "quit":
            adopting.cancel()
            for pool in pools:
                pool.stop()
            return


# --------------------------------------------------------------------------- main process


async def bench(opts: argparse.Namespace, h: Harness, worker: Child, svc: Service) -> Any:
    link = await ChildLink(worker).open()
    n, missed = opts.clients, opts.missed
    ready = await link.ask("connected", 180, cmd="connect")
    if ready["failed"]:
        raise BenchError(f"{len(ready['failed'])} clients could not connect")
    uids = [uid_of(k) for k in range(n)]
    await h.wait_routes(uids)
    auth = {"Authorization": f"Bearer {svc.api_key}"}
    async with httpx.AsyncClient(base_url=svc.base_url, headers=auth, timeout=60) as http:
        await _fanout(http, "/v1/broadcast", {"content": "first", "audience": {"online": True}})
        for _ in range(200):
            if (await link.ask("positions", 10, cmd="positions"))["n"] == n:
                break
            await asyncio.sleep(0.05)
        else:
            raise BenchError("not every client got its first push")
        gw1 = h.stack.child("gw1")
        os.kill(gw1.pid, signal.SIGKILL)
        h.stack.forget(gw1)
        # The misses: P2P through the store (as the push service writes an offline
        # user's message), fan-out through the API.
        p2p, fan = missed // 2, missed - missed // 2
        async with connect_redis(h.redis_url) as redis:
            store = RedisRecoveryStore(redis, h.keys, SystemClock(), RecoveryLimits())
            for i in range(p2p):
                ids = secrets.token_hex(16), secrets.token_hex(16)
                content = json.dumps(f"p{i}").encode()
                message = Message(*ids, 0, "bench", content, int(time.time() * 1000))
                for start in range(0, n, 1000):
                    chunk = uids[start : start + 1000]
                    await store.append_queued(message, chunk, 0)
        for i in range(fan):
            if i % 2:
                await _fanout(http, "/v1/multicast", {"to": uids, "content": f"f{i}"})
            else:
                body = {"content": f"f{i}", "audience": {"online": True}}
                await _fanout(http, "/v1/broadcast", body)
    pids = {"redis": h.redis_pid or 0, "gw2": h.stack.pid("gw2")}
    before, _ = cpu_snapshot(pids)
    result = await link.ask("resumed", OVERALL_TIMEOUT_S, cmd="resume", timeout_s=120)
    after, _ = cpu_snapshot(pids)
    link.send(cmd="quit")
    expected = [f"p{i}" for i in range(p2p)] + [f"f{i}" for i in range(fan)]
    return summarize(result, expected, before, after, n)


async def _fanout(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> None:
    resp = await http.post(path, json=body)
    resp.raise_for_status()
    push_id = resp.json()["push_id"]
    for _ in range(600):
        job = (await http.get(f"/v1/pushes/{push_id}")).json()
        if job["status"] == "done":
            return
        if job["status"] == "failed":
            raise BenchError(f"job {push_id} failed: {job['error']}")
        await asyncio.sleep(0.02)
    raise BenchError(f"job {push_id} did not finish")


def summarize(
    r: dict[str, Any],
    expected: list[str],
    before: dict[str, float],
    after: dict[str, float],
    n: int,
) -> dict[str, Any]:
    times = [v[0] for v in r["done"].values()]
    incomplete = sum(1 for v in r["done"].values() if not v[1]["complete"])
    wrong_count = sum(1 for v in r["done"].values() if v[1]["count"] != len(expected))
    # P2P in acceptance order and batches in bus order; merged by time, so compare sets
    # and each stream's own order.
    bad = 0
    for got in r["got"].values():
        p = [c for c in got if c.startswith("p")]
        f = [c for c in got if c.startswith("f")]
        if len(got) != len(expected) or p + f != expected:
            bad += 1
    wall = max(times) if times else float("nan")
    return {
        "clients": n,
        "missed_each": len(expected),
        "resumed": len(times),
        "failed_to_connect": len(r["failed"]),
        "all_recovered_s": wall,
        "per_client_s": spread(times),
        "incomplete": incomplete,
        "wrong_count": wrong_count,
        "clients_with_wrong_messages": bad,
        "live_before_replay_end": r["early_live"],
        "client_pool": r["pool"],
        "cpu_s": {k: after[k] - before[k] for k in after if k in before},
    }


def report(res: dict[str, Any], cond: dict[str, str]) -> None:
    s = res["per_client_s"]
    lines = [
        "resume storm",
        *machine_lines(cond),
        f"  clients     {res['clients']} resumed at once on gw2, {res['missed_each']} missed each",
        f"  all back    {res['all_recovered_s']:.2f} s until the last `recovered` frame "
        f"(per client p50 {s['p50']:.2f} / p99 {s['p99']:.2f} s)",
        f"  correct     {res['resumed']} resumed, {res['failed_to_connect']} failed to connect, "
        f"{res['incomplete']} incomplete, {res['wrong_count']} wrong counts, "
        f"{res['clients_with_wrong_messages']} with wrong messages",
        "  cpu during  " + ", ".join(f"{k} {v:.2f} s" for k, v in res["cpu_s"].items()),
    ]
    print("\n".join(lines), flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=in_range(int, 2, 15000), default=5000)
    p.add_argument("--missed", type=in_range(int, 2, 200), default=20)
    add_run_flags(p, "500 clients, 10 missed")
    add_worker_flag(p)
    return parse_run_args(p, argv, clients=500, missed=10)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return serve_worker(_worker, args.worker, 2)
    return run_main("resume_storm", lambda h: _run(h, args), nofile=2 * args.clients + 4096)


def _run(h: Harness, args: argparse.Namespace) -> None:
    svc = start_service(h, ["g1", "g1"])
    spec = {"urls": svc.ws_urls, "indices": [0, args.clients, 1]}
    worker = spawn_worker(h, "bench.resume_storm", spec)
    result = run_async(lambda: bench(args, h, worker, svc), OVERALL_TIMEOUT_S)
    report(result, h.cond)
    print_json(args.json, {"conditions": h.cond, "results": result})
    if result["resumed"] < args.clients:
        raise BenchError(f"only {result['resumed']} of {args.clients} clients resumed")


if __name__ == "__main__":
    sys.exit(main())
