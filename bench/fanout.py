"""Gateway fan-out benchmark: one pre-built frame to N local WebSocket connections.

Starts ONE gateway as a child process (free loopback ports, a unique Redis key prefix),
measures its idle RSS, connects N clients from a few client processes, measures the RSS
again (idle memory per connection), then runs broadcast rounds: the gateway is called
directly (GrpcGatewayClients, to_batch: its delivery link, else DeliverMany), one call
per batch of 1000 uids, the batches covering all N clients. Per round:

- broadcast latency: first call -> the last client has the frame;
- Deliver time: first call -> every call has returned, and from it the gateway-side
  frames/s (frames written / Deliver time).

Every child process is stopped by its PID on exit, Ctrl-C and errors.

    .venv/bin/python -m bench.fanout --quick
    .venv/bin/python -m bench.fanout --clients 10000 --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from bench.harness.cli import add_run_flags, in_range, parse_run_args
from bench.harness.clients import indices_of, spec_pool, uid_of
from bench.harness.link import ChildLink, emit, stdin_commands
from bench.harness.report import machine_lines, print_json
from bench.harness.stack import (
    HOST,
    BenchError,
    BenchStack,
    Harness,
    raise_nofile,
    run_async,
    run_main,
)
from bench.harness.stats import all_cpu, best_of, others_cpu, vm_kib
from bench.harness.workers import add_worker_flag, serve_worker, spawn_worker
from router.fleet.codec import decode_gateway
from router.gateway_rpc.client import GrpcGatewayClients
from router.processes.devstack import gateway_argv
from router.processes.ports import free_port
from router.processes.supervisor import Child
from router.testing import deliver_one
from shared.batches import to_batch
from shared.ids import new_id
from shared.keys import KeySchema
from shared.models import Message
from shared.wire import encode_push_json, ws_text_frame

GATEWAY_ID = "gw1"
READY_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 150.0
ROUND_TIMEOUT_S = 15.0
DELIVER_TIMEOUT_S = 10.0
OVERALL_TIMEOUT_S = 200.0  # the async part; each run stays well under five minutes
CONNECT_PARALLEL = 32  # handshakes in flight per client process (listen backlog is 100)


# --------------------------------------------------------------------------- client process


async def _worker(spec: dict[str, Any]) -> None:
    """A client process: connects its share of the clients on 'go', then times each round."""
    # round -> [frames, first arrival, last arrival]; time.monotonic() is CLOCK_MONOTONIC,
    # so the parent can compare it with its own clock.
    rounds: dict[int, list[float]] = {}
    stats = {"bad": 0}
    expected = [len(indices_of(spec))]
    cache: list[Any] = [None, -1]  # every client gets the same text in a round: parse once

    def on_frame(conn: object, now: float, data: bytes) -> None:
        if data == cache[0]:
            r = cache[1]
        else:
            try:
                r = int(json.loads(data)["content"]["round"])
            except (ValueError, KeyError, TypeError):
                stats["bad"] += 1
                return
            cache[0], cache[1] = data, r
        st = rounds.get(r)
        if st is None:
            rounds[r] = st = [0, now, now]
        st[0] += 1
        st[2] = now
        if st[0] == expected[0]:
            emit(event="done", round=r, n=st[0], first=st[1], last=st[2])

    pool = spec_pool(spec, on_frame, CONNECT_PARALLEL)
    async for cmd in stdin_commands():
        if cmd["cmd"] == "go":
            started = time.monotonic()
            failed = await pool.start()
            expected[0] = len(indices_of(spec)) - len(failed)
            seconds = time.monotonic() - started
            emit(event="ready", connected=expected[0], failed=failed, seconds=seconds)
        elif cmd["cmd"] == "stat":
            st = rounds.get(cmd["round"], [0, math.nan, math.nan])
            n, first, last = st
            emit(event="stat", round=cmd["round"], n=n, first=first, last=last, open=pool.open,
                 **stats, **pool.stats)  # fmt: skip
    pool.stop()
    os._exit(0)  # no closing handshakes: the OS closes the sockets


@dataclass
class Round:
    deliver_s: float
    broadcast_s: float
    spread_s: float  # first to last arrival at the clients
    delivered: int
    received: int


async def wait_gateway(
    redis_url: str, keys: KeySchema, stack: BenchStack, connections: int
) -> None:
    """Until the gateway's fleet record (refreshed every heartbeat) shows `connections`."""
    import redis.asyncio as aioredis

    client = aioredis.from_url(redis_url, decode_responses=True)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        seen = -1
        while time.monotonic() < deadline:
            stack.check()
            value = await client.get(keys.gateway(GATEWAY_ID))
            info = decode_gateway(str(value)) if value else None  # a str: decode_responses
            if info is not None:
                seen = info.connections
                if seen >= connections:
                    return
            await asyncio.sleep(0.2)
        raise BenchError(f"the gateway reports {seen} connections, expected {connections}")
    finally:
        await client.aclose()


async def one_round(
    r: int,
    clients: GrpcGatewayClients,
    address: str,
    uids: list[str],
    batch_size: int,
    links: list[ChildLink],
    expected: list[int],
) -> Round:
    content = json.dumps({"round": r, "text": "broadcast"}).encode()
    message = Message(new_id(), new_id(), 0, "bench", content, time.time_ns() // 1_000_000)
    batches = [
        to_batch(message, uids[i : i + batch_size], new_id())
        for i in range(0, len(uids), batch_size)
    ]
    t0 = time.monotonic()
    replies = await asyncio.gather(
        *(deliver_one(clients, GATEWAY_ID, address, b, DELIVER_TIMEOUT_S) for b in batches)
    )
    t1 = time.monotonic()
    delivered = sum(len(reply.delivered) for reply in replies)
    firsts: list[float] = []
    lasts: list[float] = []
    received = 0
    for link, want in zip(links, expected, strict=True):
        try:
            msg = await link.expect("done", ROUND_TIMEOUT_S, lambda m: m["round"] == r)
        except BenchError:
            link.send(cmd="stat", round=r)
            msg = await link.expect("stat", 10, lambda m: m["round"] == r)
        if msg["n"]:
            firsts.append(msg["first"])
            lasts.append(msg["last"])
        received += min(msg["n"], want)
    return Round(
        deliver_s=t1 - t0,
        broadcast_s=(max(lasts) - t0) if lasts else math.nan,
        spread_s=(max(lasts) - min(firsts)) if lasts else math.nan,
        delivered=delivered,
        received=received,
    )


@dataclass
class Options:
    clients: int
    procs: int
    rounds: int
    batch: int
    json_out: bool


async def bench(
    opts: Options, h: Harness, workers: list[Child], grpc_port: int, rss_before_kb: int
) -> dict[str, Any]:
    stack = h.stack
    gw_pid = stack.pid(GATEWAY_ID)
    links = [await ChildLink(w).open() for w in workers]
    for link in links:
        link.send(cmd="go")
    readies = [await link.expect("ready", CONNECT_TIMEOUT_S) for link in links]
    connect_s = max(r["seconds"] for r in readies)
    failed = {k for r in readies for k in r["failed"]}
    expected = [r["connected"] for r in readies]
    connected = sum(expected)
    if not connected:
        raise BenchError("no client could connect")
    uids = [uid_of(k) for k in range(opts.clients) if k not in failed]
    # Registered (a route) and held (the gateway's count): 1013-closed clients are back.
    await h.wait_routes(uids)
    await wait_gateway(h.redis_url, h.keys, stack, connected)
    await asyncio.sleep(2.0)  # idle: let the handshakes' garbage go
    rss_after_kb = vm_kib(gw_pid)["VmRSS"]

    address = f"{HOST}:{grpc_port}"
    clients = GrpcGatewayClients()
    rounds: list[Round] = []
    try:
        await one_round(0, clients, address, uids, opts.batch, links, expected)  # warm-up
        await asyncio.sleep(0.5)
        all0 = all_cpu()
        t_start = time.monotonic()
        for r in range(1, opts.rounds + 1):
            rounds.append(await one_round(r, clients, address, uids, opts.batch, links, expected))
            stack.check()
            await asyncio.sleep(0.5)
        all1 = all_cpu()
        t_rounds = time.monotonic() - t_start
    finally:
        await clients.close()
    finals = [await link.ask("stat", 10, cmd="stat", round=-1) for link in links]

    worker_pids = {w.pid for w in workers}
    cpu_gw = all1.get(gw_pid, 0.0) - all0.get(gw_pid, 0.0)
    cpu_clients = sum(all1.get(pid, 0.0) - all0.get(pid, 0.0) for pid in worker_pids)
    cpu_others = others_cpu(all0, all1, {gw_pid, os.getpid(), *worker_pids})
    sample = Message("0" * 32, "0" * 32, 0, "bench", b'{"round":1,"text":"broadcast"}', 0)
    frame = ws_text_frame(encode_push_json(sample))
    total_deliver = sum(x.deliver_s for x in rounds)
    return {
        "clients": connected,
        "clients_failed": len(failed),
        "client_procs": len(workers),
        "connect_s": connect_s,
        "batch": opts.batch,
        "batches": math.ceil(connected / opts.batch),
        "frame_bytes": len(frame),
        "rounds": [x.__dict__ for x in rounds],
        "rss_before_kb": rss_before_kb,
        "rss_after_kb": rss_after_kb,
        "kb_per_conn": (rss_after_kb - rss_before_kb) / connected,
        "broadcast_ms": best_of([x.broadcast_s * 1000 for x in rounds]),
        "deliver_ms": best_of([x.deliver_s * 1000 for x in rounds]),
        "spread_ms": best_of([x.spread_s * 1000 for x in rounds]),
        "frames_per_s": best_of([x.delivered / x.deliver_s for x in rounds], best=max),
        "lost": sum(x.delivered - x.received for x in rounds),
        "not_delivered": sum(connected - x.delivered for x in rounds),
        "try_again": sum(f["try_again"] for f in finals),
        "closed_clients": sum(f["closed"] for f in finals),
        "open_clients": sum(f["open"] for f in finals),
        # Gateway CPU over the rounds, per frame written (includes the idle gaps' heartbeats).
        "gw_cpu_us_per_frame": 1e6 * cpu_gw / max(1, sum(x.delivered for x in rounds)),
        "gw_cpu_busy_pct": 100 * cpu_gw / total_deliver if total_deliver else math.nan,
        "others_cpu_pct": 100 * cpu_others / t_rounds,
        "clients_cpu_us_per_frame": 1e6 * cpu_clients / max(1, sum(x.received for x in rounds)),
    }


def report(r: dict[str, Any], cond: dict[str, str]) -> None:
    def trio(d: dict[str, float], fmt: str = "{:8.1f}") -> str:
        return "  ".join(f"{k} {fmt.format(v)}" for k, v in d.items())

    lines = [
        "imroute gateway fan-out benchmark (gateway calls -> one gateway -> N WebSockets)",
        "conditions:",
        *machine_lines(cond),
        f"  python      {cond['python']}  client loop={cond['loop']}; the gateway runs its"
        " own default loop",
        f"  redis       {cond['redis']}",
        f"  clients     {r['clients']} connected ({r['clients_failed']} failed) from"
        f" {r['client_procs']} client processes in {r['connect_s']:.1f}s, all on this machine",
        f"  broadcast   {r['batches']} Deliver calls of <= {r['batch']} uids issued together,"
        f" frame {r['frame_bytes']} bytes, {len(r['rounds'])} rounds after 1 warm-up",
        "results:",
        f"  broadcast latency  {trio(r['broadcast_ms'])} ms  (first Deliver call -> last"
        " client has the frame)",
        f"  Deliver time       {trio(r['deliver_ms'])} ms  (first call -> all calls returned)",
        f"  gateway frames/s   {trio(r['frames_per_s'], '{:8.0f}')}  (frames / Deliver time)",
        f"  arrival spread     {trio(r['spread_ms'])} ms  (first -> last client)",
        f"  CPU per frame      gateway {r['gw_cpu_us_per_frame']:.1f} us, client processes"
        f" {r['clients_cpu_us_per_frame']:.1f} us (over the rounds; {cond['nproc']} cores shared)",
        f"  other processes    {r['others_cpu_pct']:.0f}% of one core during the rounds"
        " (not started by this run; a busy neighbour skews every figure)",
        f"  frames             lost {r['lost']}, uids not delivered {r['not_delivered']}",
        f"  clients            {r['open_clients']} open at the end, {r['closed_clients']} closed;"
        f" {r['try_again']} closes with 1013 (try again) while connecting, reconnected",
        f"  idle memory        RSS {r['rss_before_kb'] / 1024:.1f} MiB before, "
        f"{r['rss_after_kb'] / 1024:.1f} MiB with {r['clients']} idle clients ->"
        f" {r['kb_per_conn']:.1f} KiB per connection",
        "  rounds (ms)        "
        + "; ".join(
            f"{x['broadcast_s'] * 1000:.0f}/{x['deliver_s'] * 1000:.0f}" for x in r["rounds"]
        )
        + "  (broadcast/Deliver)",
    ]
    print("\n".join(lines), flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--clients", type=in_range(int, 1, 25000), default=10000, help="connections (default 10000)"
    )
    p.add_argument(
        "--client-procs", type=in_range(int, 1, 8), default=2, help="client processes (default 2)"
    )
    p.add_argument(
        "--rounds", type=in_range(int, 1, 50), default=7, help="measured broadcasts (default 7)"
    )
    p.add_argument(
        "--batch",
        type=in_range(int, 1, 1000, " (the push API's limit)"),
        default=1000,
        help="uids per Deliver call (1000)",
    )
    add_run_flags(p, "1000 clients, 3 rounds")
    add_worker_flag(p)
    return parse_run_args(p, argv, clients=1000, rounds=3)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return serve_worker(_worker, args.worker)
    opts = Options(args.clients, args.client_procs, args.rounds, args.batch, args.json)
    # The gateway inherits this limit and holds one descriptor per client.
    limit = raise_nofile(opts.clients + 1024)
    if limit < opts.clients + 256:
        print(f"fanout bench: RLIMIT_NOFILE is {limit}; too low for {opts.clients} clients")
        return 2
    return run_main("fanout", lambda h: _fanout(h, opts))


def _fanout(h: Harness, opts: Options) -> None:
    ws_port, grpc_port = free_port(), free_port()
    # Every child is spawned here, before any thread exists (BenchStack.spawn uses preexec_fn).
    h.stack.spawn(GATEWAY_ID, gateway_argv(GATEWAY_ID, "g1", HOST, ws_port, grpc_port))
    announced = redis.Redis.from_url(h.redis_url, socket_timeout=2)
    try:
        gateway_key = h.keys.gateway(GATEWAY_ID)
        found = h.stack.wait_until(
            lambda: announced.exists(gateway_key) or None, READY_TIMEOUT_S, interval_s=0.1
        )
    finally:
        announced.close()
    if found is None:
        raise BenchError(f"the gateway did not announce itself within {READY_TIMEOUT_S:.0f}s")
    spec, n = {"urls": [f"ws://{HOST}:{ws_port}/ws"]}, opts.clients
    workers = [
        spawn_worker(h, "bench.fanout", spec | {"indices": [w, n, opts.procs]}, f"clients{w}")
        for w in range(min(opts.procs, opts.clients))
    ]
    time.sleep(1.0)  # the gateway idles: measure its RSS with no client
    rss_before = vm_kib(h.stack.pid(GATEWAY_ID))["VmRSS"]
    result = run_async(lambda: bench(opts, h, workers, grpc_port, rss_before), OVERALL_TIMEOUT_S)
    report(result, h.cond)
    print_json(opts.json_out, {"conditions": h.cond, "results": result})


if __name__ == "__main__":
    sys.exit(main())
