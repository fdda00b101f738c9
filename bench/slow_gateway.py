"""P2P latency when 1 of 4 gateways is slow: with the circuit breaker and retries, and without.

Everything is real and on loopback: Redis (a unique key prefix), four gateways (gw1..gw4,
in-process `socket_gateway.app.Gateway`s in one child process; gw4 wrapped in
`socket_gateway.faults.DelayCalls`, so its gRPC Deliver answers `--slow-ms` late), a
client process holding `--clients` WebSocket clients (client k is uid u<k> on gateway
k mod 4), and the push service as `imroute push-service` (uvicorn) in a child process of
its own. The load generator (this process) sends `POST /v1/push` to one random connected
uid at a time on an open-loop schedule (`--rate` pushes/s for `--duration` s per phase).

Each phase gets a fresh push service (the gateways and clients stay up), all with the
same P2P deadline `--deadline` (IMROUTE_DELIVER_TIMEOUT_S, 0.1 s), below the slowness:

- baseline: gw4's delay switched off, the default circuit and retries: the noise floor
  of this machine at this rate, to read the other phases against;
- without: IMROUTE_DELIVER_RETRIES=0, IMROUTE_CIRCUIT_FAILURES=0 (the circuit never
  opens);
- with: IMROUTE_DELIVER_RETRIES=1, IMROUTE_CIRCUIT_FAILURES=5,
  IMROUTE_CIRCUIT_COOL_OFF_S=10 (the defaults);
- long (with `--long-deadline S`, or named in `--phases`): as "with", but a deadline of
  S seconds (0.3), above the slowness: slow calls succeed, the circuit should stay shut.

Per phase it reports REST latency p50/p90/p99/max for all pushes, for pushes to users on
the healthy gateways and for pushes to users on the slow one; what the answers said
(delivered / failed / offline, and why they failed); when the circuit refused calls and
when a half-open probe got through; the push service's per-gateway call counters
(`/metrics`); and, from the clients, whether every push reported delivered arrived
exactly once (per push and per uid) and whether any push reported failed arrived anyway.

Every child process is stopped by its PID on exit, Ctrl-C and errors, and the key prefix
is deleted.

    .venv/bin/python -m bench.slow_gateway --quick      # ~45 s
    .venv/bin/python -m bench.slow_gateway              # ~2 min
    .venv/bin/python -m bench.slow_gateway --long-deadline 0.3 --json
    .venv/bin/python -m bench.slow_gateway --phases without,with,without
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import secrets
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.harness.cli import add_run_flags, in_range
from bench.harness.clients import uid_of
from bench.harness.link import ChildLink
from bench.harness.load import make_clients, run_load, skip_missing_sniffio
from bench.harness.report import code_version, print_json, redis_facts
from bench.harness.stack import HOST, BenchError, Harness, run_async, run_main
from bench.harness.stats import cpu_snapshot, others_cpu, steal_seconds
from bench.harness.workers import add_worker_flag, spawn_worker
from bench.slow_gateway_report import (
    GATEWAYS,
    REDIS_SAMPLE_S,
    SLOW_GATEWAY,
    WARMUP_PUSHES,
    Options,
    Phase,
    Push,
    Totals,
    report,
    summarize,
)
from bench.slow_gateway_stack import (
    clients_main,
    gateways_main,
    sample_redis,
    scrape_metrics,
    wait_push_service,
)
from router.processes.ports import free_port

CONNECT_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 30.0
LATE_WAIT_S = 1.0  # after the last answer, for frames of pushes reported failed that come late
DRAIN_TIMEOUT_S = 5.0
PHASE_STRIDE = 10_000_000  # phase p's pushes carry seq p*PHASE_STRIDE + i


def imroute_cli() -> list[str]:
    """The `imroute` console script next to this interpreter (the venv's)."""
    script = Path(sys.executable).with_name("imroute")
    if not script.exists():
        raise BenchError(f"no imroute command at {script}: is the package installed?")
    return [str(script)]


def bodies_of(pushes: list[Push]) -> list[bytes]:
    return [
        json.dumps({"to": [p.uid], "content": {"seq": p.seq, "text": "bench"}}).encode()
        for p in pushes
    ]


# --------------------------------------------------------------------------- orchestration


@dataclass
class Run:
    h: Harness
    opts: Options
    api_key: str
    gateways: ChildLink
    clients: ChildLink
    cpu_pids: dict[str, int]


async def bench(run: Run) -> dict[str, Any]:
    opts, h = run.opts, run.h
    await run.gateways.open()
    await run.clients.open()
    try:
        await run.gateways.expect("ready", READY_TIMEOUT_S)
        run.clients.send(cmd="go")
        ready = await run.clients.expect("ready", CONNECT_TIMEOUT_S)
        failed = set(ready["failed"])
        uids = [uid_of(k) for k in range(opts.clients) if k not in failed]
        if not uids:
            raise BenchError("no client could connect")
        h.stack.check()
        where = await h.wait_routes(uids)
        if SLOW_GATEWAY not in where.values():
            raise BenchError(f"no client is connected to the slow gateway {SLOW_GATEWAY}")
        setup = {
            "clients": len(uids),
            "clients_failed": len(failed),
            "connect_s": ready["seconds"],
            "per_gateway": {g: sum(1 for w in where.values() if w == g) for g in GATEWAYS},
        }
        phases = [
            await run_phase(run, p, phase, uids, where) for p, phase in enumerate(opts.phases())
        ]
        return {"setup": setup, "phases": phases}
    finally:
        run.gateways.close()
        run.clients.close()


async def run_phase(
    run: Run, index: int, phase: Phase, uids: list[str], where: dict[str, str]
) -> dict[str, Any]:
    opts = run.opts
    rng = random.Random(opts.seed + index)
    base = index * PHASE_STRIDE
    targets = [rng.choice(uids) for _ in range(max(1, round(opts.rate * opts.duration)))]
    pushes = [Push(base + i, uid, where[uid] == SLOW_GATEWAY) for i, uid in enumerate(targets)]
    healthy = [u for u in uids if where[u] != SLOW_GATEWAY]
    segments = 1  # one push service per phase (the code can spread a phase over more)
    size = math.ceil(len(pushes) / segments)
    run.gateways.send(cmd="delay", seconds=opts.slow_s if phase.slow else 0.0)
    await run.gateways.expect("delay", 10)
    totals = Totals()
    for k in range(segments):
        name = f"push-service-{index + 1}" + (f".{k + 1}" if segments > 1 else "")
        part = pushes[k * size : (k + 1) * size]
        warm = [Push(-1 - j, rng.choice(healthy), False) for j in range(WARMUP_PUSHES)]
        await run_segment(run, name, phase, part, warm, totals)

    # Frames still on their way; and time for late frames of pushes reported failed.
    expected = sum(1 for p in pushes if p.outcome == "delivered")
    await asyncio.sleep(LATE_WAIT_S)
    await run.clients.count_up_to(expected, DRAIN_TIMEOUT_S)
    dump = await run.clients.ask("dump", 30, cmd="dump")
    return summarize(phase, opts, pushes, dump, totals, segments)


async def run_segment(
    run: Run, name: str, phase: Phase, pushes: list[Push], warm: list[Push], totals: Totals
) -> None:
    """A fresh push service with the phase's settings; `pushes` on the open-loop schedule."""
    h, opts = run.h, run.opts
    port = free_port()
    h.env.update(phase.env())
    proc = h.stack.spawn(
        name, [*imroute_cli(), "push-service", "--host", HOST, "--port", str(port)]
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://{HOST}:{port}", trust_env=False) as http:
            await wait_push_service(http, run.api_key, h.stack.check)
            skip_missing_sniffio()
            clients = make_clients(f"http://{HOST}:{port}", run.api_key, opts.concurrency)
            pids = run.cpu_pids | {"push service": proc.pid}
            try:
                # Not measured: opens the keep-alive and gRPC connections to the healthy
                # gateways (the warm-up never calls the slow one: its circuit starts clean).
                await run_load(clients, warm, bodies_of(warm), 2000, opts.concurrency, 60)
                run.gateways.send(cmd="stats")
                gw_before = (await run.gateways.expect("stats", 10))["gateways"]
                cpu_before, all_before = cpu_snapshot(pids)
                steal_before = steal_seconds()
                started = time.monotonic()
                duration = len(pushes) / opts.rate
                sampler = asyncio.create_task(
                    sample_redis(h.redis_url, h.prefix, max(0.0, (duration - REDIS_SAMPLE_S) / 2))
                )
                await run_load(
                    clients,
                    pushes,
                    bodies_of(pushes),
                    opts.rate,
                    opts.concurrency,
                    2 * duration + 5,
                )
                wall = time.monotonic() - started
                redis_rates = await sampler
                cpu_after, all_after = cpu_snapshot(pids)
                steal = steal_seconds() - steal_before
            finally:
                for client in clients:
                    await client.aclose()
            run.gateways.send(cmd="stats")
            gw_after = (await run.gateways.expect("stats", 10))["gateways"]
            totals.add(totals.metrics, await scrape_metrics(http))
        h.stack.check()
    finally:
        h.stack.stop_named(name)
    totals.wall_s += wall
    answered = [p for p in pushes if not math.isnan(p.answered)]
    if answered:
        totals.span_s += max(p.answered for p in answered) - min(p.sent for p in answered)
    totals.add(totals.cpu_s, {"steal": steal})
    totals.redis.append(redis_rates)
    totals.add(
        totals.cpu_s, {n: cpu_after[n] - cpu_before[n] for n in cpu_after if n in cpu_before}
    )
    totals.add(totals.cpu_s, {"others": others_cpu(all_before, all_after, set(pids.values()))})
    for key, into in (("batches", totals.batches), ("calls", totals.calls)):
        totals.add(into, {g: gw_after[g][key] - gw_before[g][key] for g in GATEWAYS})


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--clients",
        type=in_range(int, 4, 10000),
        help="WebSocket clients (default 400; 100 with --quick)",
    )
    p.add_argument(
        "--rate", type=in_range(float, 1, 5000), help="pushes/s (default 200; 150 with --quick)"
    )
    p.add_argument(
        "--duration",
        type=in_range(float, 1, 120, " seconds"),
        help="seconds per phase (default 30; 8 with --quick)",
    )
    p.add_argument(
        "--deadline",
        type=in_range(float, 0.001, 60, " seconds"),
        default=0.1,
        help="IMROUTE_DELIVER_TIMEOUT_S (default 0.1)",
    )
    p.add_argument(
        "--slow-ms",
        type=in_range(float, 0, 10000),
        default=200,
        help="gw4's added delay (default 200)",
    )
    p.add_argument(
        "--long-deadline",
        type=in_range(float, 0.001, 60, " seconds"),
        help="add the phase 'long': the circuit as in 'with', and this deadline in s\n"
        "(above the delay; default 0.3 when 'long' is named in --phases)",
    )
    p.add_argument(
        "--phases",
        help="which phases, in order, from baseline, without, with, long\n"
        "(default: baseline,without,with; and long with --long-deadline)",
    )
    add_run_flags(p, "100 clients, 150/s, 8 s per phase", concurrency=128)
    add_worker_flag(p, "--serve-gateways")
    add_worker_flag(p, "--serve-clients")
    args = p.parse_args(argv)
    args.clients = args.clients or (100 if args.quick else 400)
    args.rate = args.rate or (150.0 if args.quick else 200.0)
    args.duration = args.duration or (8.0 if args.quick else 30.0)
    if args.phases is None:
        args.phases = "baseline,without,with" + (",long" if args.long_deadline else "")
    args.phases = tuple(x.strip() for x in args.phases.split(",") if x.strip())
    if not args.phases or not set(args.phases) <= {"baseline", "without", "with", "long"}:
        p.error("--phases takes a comma-separated list of baseline, without, with, long")
    if args.long_deadline is None:
        args.long_deadline = 0.3
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_gateways:
        return gateways_main(json.loads(args.serve_gateways))
    if args.serve_clients:
        return clients_main(args.serve_clients)
    opts = Options(
        args.clients,
        args.rate,
        args.duration,
        args.deadline,
        args.slow_ms / 1000,
        args.long_deadline,
        args.phases,
        args.concurrency,
        args.seed,
        args.json,
    )
    # Children inherit the limit: the gateways' process holds every client's socket.
    return run_main("slow-gateway", lambda h: _slow_gateway(h, opts), nofile=opts.clients + 4096)


def _slow_gateway(h: Harness, opts: Options) -> None:
    api_key = secrets.token_urlsafe(24)
    h.env["IMROUTE_API_KEY"] = api_key
    # The push service opens its user directory at start: a migrated SQLite file of ours.
    h.env["IMROUTE_DB_URL"] = f"sqlite+aiosqlite:///{h.stack.log_dir / 'users.db'}"
    h.cond["redis_version"] = redis_facts(h.redis_url)["redis_version"]
    h.cond["code"] = code_version()
    upgrade = subprocess.run(
        [*imroute_cli(), "db", "upgrade"], env=h.env, capture_output=True, timeout=60, check=False
    )
    if upgrade.returncode != 0:
        raise BenchError(f"imroute db upgrade failed: {upgrade.stderr.decode(errors='replace')}")

    # Every port is picked here and every long-lived child forked before the first thread.
    ports = {gid: (free_port(), free_port()) for gid in GATEWAYS}
    gw_spec = {
        "gateways": [
            [gid, ws, grpc, opts.slow_s if gid == SLOW_GATEWAY else 0.0]
            for gid, (ws, grpc) in ports.items()
        ]
    }
    me = "bench.slow_gateway"
    gateways = spawn_worker(h, me, gw_spec, "gateways", "--serve-gateways")
    cl_spec = {
        "urls": [f"ws://{HOST}:{ws}/ws" for ws, _ in ports.values()],
        "indices": [0, opts.clients, 1],
    }
    clients = spawn_worker(h, me, cl_spec, "clients", "--serve-clients")
    run = Run(h, opts, api_key, ChildLink(gateways), ChildLink(clients), h.cpu_pids())
    phases = len(opts.phases())
    result = run_async(lambda: bench(run), 120 + phases * (2 * opts.duration + 60))
    report(result, h.cond, opts)
    print_json(opts.json_out, {"conditions": h.cond, "results": result})


if __name__ == "__main__":
    sys.exit(main())
