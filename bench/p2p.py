"""P2P push benchmark: REST /v1/push -> push service -> delivery link -> gateway -> WebSocket.

Starts its own stack as child processes on free loopback ports (the push service and two
gateways in two groups, under a unique Redis key prefix), connects N WebSocket clients in a
separate client process, then sends pushes, each to one random connected uid, through the
REST API on an open-loop schedule. It reports the achieved pushes/s, the end-to-end latency
(from just before the REST call until the client process has the frame) and the REST-call
latency, plus errors and lost frames, the CPU of every process and what Redis did per
push (INFO deltas); every child process is stopped by its PID on exit, Ctrl-C and errors.
With --ack on every client acks each push as it arrives; --wait-ack-ms N sends each
push with `wait_ack_ms` (the REST latency then includes the ack's way back); --receipts
off runs the stack with IMROUTE_RECEIPTS_TTL_S=0.

    .venv/bin/python -m bench.p2p --quick
    .venv/bin/python -m bench.p2p --clients 2000 --rate 1000 --duration 10
    .venv/bin/python -m bench.p2p --ack on --wait-ack-ms 5000 --rate 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import httpx

from bench.harness.cli import add_run_flags, in_range, parse_run_args
from bench.harness.clients import ack_frame, indices_of, send_now, spec_pool, uid_of
from bench.harness.internal import add_internal_flag, internal_credentials
from bench.harness.link import ChildLink, emit, stdin_commands
from bench.harness.load import make_clients, run_load, skip_missing_sniffio
from bench.harness.redis_info import redis_counters
from bench.harness.report import print_json
from bench.harness.stack import BenchError, Harness, Service, run_async, run_main, start_service
from bench.harness.stats import cpu_snapshot, others_cpu
from bench.harness.workers import add_worker_flag, serve_worker, spawn_worker
from bench.p2p_report import Options, PushRecord, report, summarize
from router.processes.supervisor import Child

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

CONNECT_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 5.0
OVERALL_TIMEOUT_S = 200.0  # the async part; each run stays well under five minutes
WARMUP_PUSHES = 200
RECEIPTS_SAMPLED = 200  # delivered pushes whose receipt is read after the run


# --------------------------------------------------------------------------- client process


async def _worker(spec: dict[str, Any]) -> None:
    """The client process: connects its clients on 'go', records every push frame's arrival."""
    # seq -> (arrival, msg_id); time.monotonic() is CLOCK_MONOTONIC, shared by all processes.
    arrivals: dict[int, tuple[float, str]] = {}
    stats = {"duplicates": 0, "bad": 0, "acks_sent": 0}
    ack = bool(spec.get("ack"))

    def on_frame(conn: ClientConnection, now: float, data: bytes) -> None:
        try:
            frame = json.loads(data)
            if frame["type"] == "recovered":  # ends each new connection's (empty) replay
                return
            seq = int(frame["content"]["seq"])
            msg_id = str(frame["msg_id"])
            pos = str(frame["pos"]) if ack else ""
        except (ValueError, KeyError, TypeError):
            stats["bad"] += 1
            return
        if pos and send_now(conn, ack_frame(pos)):  # done with it at once
            stats["acks_sent"] += 1
        if seq in arrivals:
            stats["duplicates"] += 1
        else:
            arrivals[seq] = (now, msg_id)

    pool = spec_pool(spec, on_frame)
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


async def bench(
    opts: Options, h: Harness, worker: Child, svc: Service, pids: dict[str, int]
) -> dict[str, Any]:
    link = await ChildLink(worker).open()
    link.send(cmd="go")
    ready = await link.expect("ready", CONNECT_TIMEOUT_S)
    failed = set(ready["failed"])
    connected = [k for k in range(opts.clients) if k not in failed]
    if not connected:
        raise BenchError("no client could connect")
    h.stack.check()
    await h.wait_routes([uid_of(k) for k in connected])

    rng = random.Random(opts.seed)
    total = max(1, round(opts.rate * opts.duration))
    targets = [rng.choice(connected) for _ in range(total)]
    bodies = [
        json.dumps(
            {"to": [uid_of(k)], "content": {"seq": i, "text": "bench"}, "store": opts.store}
            | ({} if opts.wait_ack_ms is None else {"wait_ack_ms": opts.wait_ack_ms})
        ).encode()
        for i, k in enumerate(targets)
    ]
    warm = [
        json.dumps({"to": [uid_of(rng.choice(connected))], "content": {"seq": -1 - j}}).encode()
        for j in range(WARMUP_PUSHES)
    ]
    skip_missing_sniffio()
    clients = make_clients(svc.base_url, svc.api_key, opts.concurrency)
    try:
        # Warm-up, not measured: opens the keep-alive and gRPC connections, fills caches.
        await run_load(clients, [PushRecord() for _ in warm], warm, 1e9, opts.concurrency, 60)
        redis_before = redis_counters(h.redis_url)
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
        redis_after = redis_counters(h.redis_url)
        cpu_after["others"] = others_cpu(all_before, all_after, set(pids.values()))
        cpu_before["others"] = 0.0
        # Drain: wait for frames still on their way, then fetch every arrival.
        await link.count_up_to(sum(1 for r in records if r.delivered), DRAIN_TIMEOUT_S)
        sampled = await read_receipts(clients[0], records, rng) if opts.receipts else None
    finally:
        for client in clients:
            await client.aclose()
    dump = await link.ask("dump", 30, cmd="dump")
    h.stack.check()
    delta = redis_after.minus(redis_before) if redis_before and redis_after else None
    return summarize(
        opts, records, dump, len(connected), ready, wall1 - wall0, cpu_before, cpu_after,
        delta, sampled,
    )  # fmt: skip


async def read_receipts(
    client: httpx.AsyncClient, records: list[PushRecord], rng: random.Random
) -> dict[str, int]:
    """The receipts of some delivered pushes, once the gateways' last ack flush is in:
    how many of their recipients are acked, and delivered."""
    await asyncio.sleep(0.5)  # a gateway writes acks every 50 ms
    ids = [r.push_id for r in records if r.delivered and r.push_id]
    out = {"pushes": 0, "acked": 0, "delivered": 0, "errors": 0}
    for push_id in rng.sample(ids, min(RECEIPTS_SAMPLED, len(ids))):
        resp = await client.get(f"/v1/pushes/{push_id}")
        if resp.status_code != 200:
            out["errors"] += 1
            continue
        got = resp.json()
        out["pushes"] += 1
        out["acked"] += int(got.get("acked") or 0)
        out["delivered"] += int(got.get("delivered") or 0)
    return out


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
    p.add_argument(
        "--ack", choices=["on", "off"], default="off",
        help="on: every client acks each push as it arrives (default off)",
    )  # fmt: skip
    p.add_argument(
        "--wait-ack-ms", type=in_range(int, 0, 10000), default=None,
        help='"wait_ack_ms" of each push (default: none)',
    )  # fmt: skip
    p.add_argument(
        "--receipts", choices=["on", "off"], default="on",
        help="off: IMROUTE_RECEIPTS_TTL_S=0 (no receipts; default on)",
    )  # fmt: skip
    add_run_flags(p, "200 clients, 3 s, 200/s", concurrency=64)
    add_worker_flag(p)
    args = parse_run_args(p, argv, clients=200, duration=3.0)
    if args.wait_ack_ms is not None and args.receipts == "off":
        p.error("--wait-ack-ms needs receipts (--receipts on)")
    if args.rate is None:
        args.rate = 200.0 if args.quick else 1000.0
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return serve_worker(_worker, args.worker)
    opts = Options(args.clients, args.rate, args.duration, args.concurrency, args.seed,
                   args.json, args.store == "on", args.internal, args.ack == "on",
                   args.wait_ack_ms, args.receipts == "on")  # fmt: skip
    # Children inherit the limit: each gateway holds about half of the clients.
    return run_main("p2p", lambda h: _p2p(h, opts), nofile=opts.clients + 4096)


def _p2p(h: Harness, opts: Options) -> None:
    h.cond["store"] = "on" if opts.store else "off"
    if not opts.receipts:
        h.env["IMROUTE_RECEIPTS_TTL_S"] = "0"
    internal_credentials(h.env, h.cond, opts.internal)
    svc = start_service(h, ["g1", "g2"])
    spec = {"urls": svc.ws_urls, "indices": [0, opts.clients, 1], "ack": opts.ack}
    worker = spawn_worker(h, "bench.p2p", spec)
    cpu_pids = h.cpu_pids()
    result = run_async(lambda: bench(opts, h, worker, svc, cpu_pids), OVERALL_TIMEOUT_S)
    report(result, h.cond)
    print_json(opts.json_out, {"conditions": h.cond, "results": result})


if __name__ == "__main__":
    sys.exit(main())
