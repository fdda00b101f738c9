"""P2P push benchmark: REST /v1/push -> push service -> gRPC Deliver -> gateway -> WebSocket.

Starts its own stack as child processes on free loopback ports (the push service and two
gateways in two groups, under a unique Redis key prefix), connects N WebSocket clients in a
separate client process, then sends pushes, each to one random connected uid, through the
REST API on an open-loop schedule. It reports the achieved pushes/s, the end-to-end latency
(from just before the REST call until the client process has the frame) and the REST-call
latency, plus errors and lost frames; every child process is stopped by its PID on exit,
Ctrl-C and errors.

    .venv/bin/python -m bench.p2p --quick
    .venv/bin/python -m bench.p2p --clients 2000 --rate 1000 --duration 10
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from bench.harness.cli import add_run_flags, in_range
from bench.harness.clients import ClientPool, indices_of, token_url, uid_of
from bench.harness.internal import add_internal_flag, internal_credentials
from bench.harness.link import ChildLink, emit, stdin_commands
from bench.harness.load import make_clients, run_load, skip_missing_sniffio
from bench.harness.report import machine_lines, print_json
from bench.harness.stack import (
    HOST,
    BenchError,
    Harness,
    bench_argv,
    raise_nofile,
    run_async,
    run_loop,
    run_main,
    start_stack,
    wait_routes,
)
from bench.harness.stats import cpu_snapshot, others_cpu, spread
from router.devtools.ports import free_port
from router.devtools.supervisor import Child

CONNECT_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 5.0
OVERALL_TIMEOUT_S = 200.0  # the async part; each run stays well under five minutes
WARMUP_PUSHES = 200


# --------------------------------------------------------------------------- client process


def worker_main(spec: dict[str, Any]) -> int:
    """The client process: connects its clients on 'go', records every push frame's arrival."""
    raise_nofile(len(indices_of(spec)) + 1024)
    run_loop(_worker(spec))
    return 0


async def _worker(spec: dict[str, Any]) -> None:
    urls: list[str] = spec["urls"]
    secret = os.environ["IMROUTE_SECRET"]
    # seq -> (arrival, msg_id); time.monotonic() is CLOCK_MONOTONIC, shared by all processes.
    arrivals: dict[int, tuple[float, str]] = {}
    stats = {"duplicates": 0, "bad": 0}

    def on_frame(conn: object, now: float, data: bytes) -> None:
        try:
            frame = json.loads(data)
            if frame["type"] == "recovered":  # ends each new connection's (empty) replay
                return
            seq = int(frame["content"]["seq"])
            msg_id = str(frame["msg_id"])
        except (ValueError, KeyError, TypeError):
            stats["bad"] += 1
            return
        if seq in arrivals:
            stats["duplicates"] += 1
        else:
            arrivals[seq] = (now, msg_id)

    pool = ClientPool(
        indices_of(spec), lambda k: token_url(urls[k % len(urls)], k, secret), on_frame
    )
    async for cmd in stdin_commands():
        if cmd["cmd"] == "go":
            started = time.monotonic()
            failed = await pool.start()
            emit(
                event="ready",
                connected=len(indices_of(spec)) - len(failed),
                failed=failed,
                seconds=time.monotonic() - started,
            )
        elif cmd["cmd"] == "count":
            emit(event="count", n=sum(1 for s in arrivals if s >= 0), open=pool.open)
        elif cmd["cmd"] == "dump":
            seqs = list(arrivals)
            emit(
                event="dump",
                seqs=seqs,
                times=[arrivals[s][0] for s in seqs],
                msg_ids=[arrivals[s][1] for s in seqs],
                open=pool.open,
                **stats,
                **pool.stats,
            )
            break
    pool.stop()
    # Leave without closing handshakes: the OS closes the sockets when the process exits.
    os._exit(0)


# --------------------------------------------------------------------------- load generator


@dataclass
class PushRecord:
    due: float = math.nan
    sent: float = math.nan
    answered: float = math.nan
    status: int = 0
    delivered: bool = False
    failed: bool = False
    msg_id: str = ""
    error: str = ""

    def answer(self, resp: httpx.Response) -> None:
        self.status = resp.status_code
        if resp.status_code == 200:
            out = resp.json()
            self.msg_id = out["msg_id"]
            self.delivered = bool(out["delivered"])
            self.failed = bool(out["failed"])
        else:
            self.error = f"HTTP {resp.status_code}"

    def fail(self, exc: Exception) -> None:
        self.error = type(exc).__name__


@dataclass
class Options:
    clients: int
    rate: float
    duration: float
    concurrency: int
    seed: int
    json_out: bool
    store: bool = True
    internal: str = "token"


async def bench(
    opts: Options, h: Harness, worker: Child, http_port: int, api_key: str, pids: dict[str, int]
) -> dict[str, Any]:
    link = await ChildLink(worker).open()
    link.send(cmd="go")
    ready = await link.expect("ready", CONNECT_TIMEOUT_S)
    failed = set(ready["failed"])
    connected = [k for k in range(opts.clients) if k not in failed]
    if not connected:
        raise BenchError("no client could connect")
    h.stack.check()
    await wait_routes(h.redis_url, h.keys, [uid_of(k) for k in connected])

    rng = random.Random(opts.seed)
    total = max(1, round(opts.rate * opts.duration))
    targets = [rng.choice(connected) for _ in range(total)]
    bodies = [
        json.dumps(
            {"to": [uid_of(k)], "content": {"seq": i, "text": "bench"}, "store": opts.store}
        ).encode()
        for i, k in enumerate(targets)
    ]
    warm = [
        json.dumps({"to": [uid_of(rng.choice(connected))], "content": {"seq": -1 - j}}).encode()
        for j in range(WARMUP_PUSHES)
    ]
    skip_missing_sniffio()
    clients = make_clients(f"http://{HOST}:{http_port}", api_key, opts.concurrency)
    try:
        # Warm-up, not measured: opens the keep-alive and gRPC connections, fills caches.
        await run_load(clients, [PushRecord() for _ in warm], warm, 1e9, opts.concurrency, 60)
        cpu_before, all_before = cpu_snapshot(pids)
        wall0 = time.monotonic()
        records = [PushRecord() for _ in bodies]
        sent = await run_load(
            clients, records, bodies, opts.rate, opts.concurrency, 2 * opts.duration + 5
        )
        for rec in records[sent:]:
            rec.error = "not sent: schedule overrun"
        wall1 = time.monotonic()
        cpu_after, all_after = cpu_snapshot(pids)
        cpu_after["others"] = others_cpu(all_before, all_after, set(pids.values()))
        cpu_before["others"] = 0.0
    finally:
        for client in clients:
            await client.aclose()

    # Drain: wait for frames still on their way, then fetch every arrival.
    await link.count_up_to(sum(1 for r in records if r.delivered), DRAIN_TIMEOUT_S)
    dump = await link.ask("dump", 30, cmd="dump")
    h.stack.check()
    return summarize(
        opts, records, dump, len(connected), ready, wall1 - wall0, cpu_before, cpu_after
    )


def summarize(
    opts: Options,
    records: list[PushRecord],
    dump: dict[str, Any],
    connected: int,
    ready: dict[str, Any],
    wall_s: float,
    cpu_before: dict[str, float],
    cpu_after: dict[str, float],
) -> dict[str, Any]:
    arrivals = {
        s: (t, m)
        for s, t, m in zip(dump["seqs"], dump["times"], dump["msg_ids"], strict=True)
        if s >= 0
    }
    ok = [r for r in records if r.status == 200]
    answered = [r.answered for r in ok]
    first_sent = min((r.sent for r in records if not math.isnan(r.sent)), default=math.nan)
    span = (max(answered) - first_sent) if answered else math.nan
    e2e: list[float] = []
    lost = mismatched = unexpected = 0
    for i, r in enumerate(records):
        got = arrivals.get(i)
        if r.delivered:
            if got is None:
                lost += 1
                continue
            if got[1] != r.msg_id:
                mismatched += 1
            e2e.append((got[0] - r.sent) * 1000)
        elif got is not None:
            unexpected += 1
    e2e.sort()
    rest = sorted((r.answered - r.sent) * 1000 for r in ok)
    lag = sorted((r.sent - r.due) * 1000 for r in records if not math.isnan(r.sent))
    errors: dict[str, int] = {}
    for r in records:
        kind = (
            r.error
            or (r.failed and "failed (gateway error)")
            or (not r.delivered and "offline (no route)")
            or ""
        )
        if kind:
            errors[kind] = errors.get(kind, 0) + 1
    cpu = {
        name: 100 * (cpu_after[name] - cpu_before[name]) / wall_s
        for name in cpu_after
        if name in cpu_before and wall_s > 0
    }

    return {
        "clients": connected,
        "clients_failed": len(ready["failed"]),
        "connect_s": ready["seconds"],
        "target_rate": opts.rate,
        "duration_s": opts.duration,
        "concurrency": opts.concurrency,
        "scheduled": len(records),
        "pushes": sum(1 for r in records if not math.isnan(r.sent)),
        "ok": len(ok),
        "delivered": sum(1 for r in records if r.delivered),
        "achieved_rate": len(ok) / span if span and span > 0 else math.nan,
        "e2e_ms": spread(e2e),
        "rest_ms": spread(rest),
        "send_lag_ms": spread(lag),
        "received": len(e2e),
        "lost": lost,
        "msg_id_mismatch": mismatched,
        "unexpected": unexpected,
        "duplicates": dump["duplicates"],
        "closed_clients": dump["closed"],
        "open_clients": dump["open"],
        "try_again": dump["try_again"],
        "bad_frames": dump["bad"],
        "errors": errors,
        "cpu_pct": cpu,
        "cpu_ms_per_push": {
            name: 1000 * (cpu_after[name] - cpu_before[name]) / len(ok) for name in cpu if ok
        },
    }


def report(result: dict[str, Any], cond: dict[str, str]) -> None:
    def ms(d: dict[str, float]) -> str:
        return "  ".join(f"{k} {v:7.2f}" for k, v in d.items()) + " ms"

    r = result
    cpu = ", ".join(f"{k} {v:.0f}%" for k, v in r["cpu_pct"].items())
    per = ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_ms_per_push"].items())
    lines = [
        "imroute P2P push benchmark (REST -> push service -> gRPC -> gateway -> WebSocket)",
        "conditions:",
        *machine_lines(cond),
        f"  python      {cond['python']}  client/loadgen loop={cond['loop']}",
        f"  stack       push service (uvicorn, 1 process) + gw1/g1 + gw2/g2; redis {cond['redis']}"
        f"; store {cond.get('store', 'on')}; internal calls {cond.get('internal', 'none')}",
        f"  clients     {r['clients']} connected ({r['clients_failed']} failed) in 1 client"
        f" process, connected in {r['connect_s']:.1f}s",
        f"  load        target {r['target_rate']:g} pushes/s for {r['duration_s']:g}s, open loop,"
        f" concurrency {r['concurrency']}, 1 random uid per push (httpx, keep-alive)",
        "results:",
        f"  pushes      {r['scheduled']} scheduled, {r['pushes']} sent, {r['ok']} HTTP 200,"
        f" {r['delivered']} delivered",
        f"  achieved    {r['achieved_rate']:.0f} pushes/s (target {r['target_rate']:g})",
        f"  end-to-end  {ms(r['e2e_ms'])}  (n={r['received']})",
        f"  REST call   {ms(r['rest_ms'])}",
        f"  send lag    {ms(r['send_lag_ms'])}  (actual send - scheduled send)",
        f"  frames      lost {r['lost']}, msg_id mismatch {r['msg_id_mismatch']}, unexpected"
        f" {r['unexpected']}, duplicates {r['duplicates']}, bad {r['bad_frames']}",
        f"  clients     {r['open_clients']} open at the end, {r['closed_clients']} closed;"
        f" {r['try_again']} closes with 1013 (try again) while connecting, reconnected",
        f"  errors      {r['errors'] or 'none'}",
        f"  cpu         {cpu}  (% of one core during the load phase; others = processes"
        " not started by this run)",
        f"  cpu / push  {per}  (ms of CPU per answered push)",
    ]
    print("\n".join(lines), flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    n = in_range(int, 1, 15000)
    p.add_argument("--clients", type=n, default=2000, help="WebSocket clients (default 2000)")
    rate = in_range(float, 1, 20000)
    p.add_argument("--rate", type=rate, help="target pushes/s (default 1000; 200 with --quick)")
    s = in_range(float, 0.5, 60, " seconds")
    p.add_argument("--duration", type=s, default=10, help="load seconds (default 10)")
    p.add_argument(
        "--store", choices=["on", "off"], default="on", help='"store" of each push (default on)'
    )
    add_internal_flag(p)
    add_run_flags(p, "200 clients, 3 s, 200/s", concurrency=64)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.clients, args.duration = 200, 3.0
    if args.rate is None:
        args.rate = 200.0 if args.quick else 1000.0
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(json.loads(args.worker))
    opts = Options(args.clients, args.rate, args.duration, args.concurrency, args.seed,
                   args.json, args.store == "on", args.internal)  # fmt: skip
    # Children inherit the limit: each gateway holds about half of the clients.
    raise_nofile(opts.clients + 4096)
    return run_main("p2p", lambda h: _p2p(h, opts))


def _p2p(h: Harness, opts: Options) -> None:
    api_key = secrets.token_urlsafe(24)
    h.env["IMROUTE_API_KEY"] = api_key
    h.cond["store"] = "on" if opts.store else "off"
    internal_credentials(h.env, h.cond, opts.internal)
    http_port = free_port()
    gateways = [("gw1", "g1", free_port(), free_port()), ("gw2", "g2", free_port(), free_port())]
    start_stack(h.stack, http_port, gateways, api_key)
    spec = {
        "urls": [f"ws://{HOST}:{ws}/ws" for _, _, ws, _ in gateways],
        "indices": [0, opts.clients, 1],
    }
    worker = h.stack.spawn(
        "clients", bench_argv("bench.p2p", "--worker", json.dumps(spec)), pipes=True
    )
    cpu_pids = {c.name: c.pid for c in h.stack.children} | {"loadgen": os.getpid()}
    if h.redis_pid:
        cpu_pids["redis"] = h.redis_pid
    result = run_async(
        lambda: bench(opts, h, worker, http_port, api_key, cpu_pids), OVERALL_TIMEOUT_S
    )
    report(result, h.cond)
    print_json(opts.json_out, {"conditions": h.cond, "results": result})


if __name__ == "__main__":
    sys.exit(main())
