"""POST /v1/push/batch benchmark: single-recipient messages at volume, 1000 per call.

Starts the same stack as bench.p2p (the push service and two gateways in two groups, as
child processes under a unique Redis key prefix) and its client process (N WebSocket
clients recording each frame's arrival), then sends `--calls` batches of `--size`
messages, each message to one random connected uid, with `--concurrency` calls in
flight. It reports messages/s from the first call to the last frame's arrival, the
calls' latency, every message's status, lost and duplicated frames, and the CPU per
message of each process.

    .venv/bin/python -m bench.push_batch --quick
    .venv/bin/python -m bench.push_batch --clients 2000 --calls 100 --concurrency 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import httpx

from bench.harness.cli import in_range, parse_run_args
from bench.harness.clients import uid_of
from bench.harness.internal import internal_credentials
from bench.harness.link import ChildLink
from bench.harness.report import print_json
from bench.harness.stack import BenchError, Harness, Service, run_async, run_main, start_service
from bench.harness.stats import cpu_snapshot
from bench.harness.workers import spawn_worker

CONNECT_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 20.0
OVERALL_TIMEOUT_S = 240.0


async def bench(
    args: argparse.Namespace, h: Harness, link: ChildLink, svc: Service, pids: dict[str, int]
) -> dict[str, Any]:
    link.send(cmd="go")
    ready = await link.expect("ready", CONNECT_TIMEOUT_S)
    connected = [k for k in range(args.clients) if k not in set(ready["failed"])]
    if not connected:
        raise BenchError("no client could connect")
    await h.wait_routes([uid_of(k) for k in connected])
    rng = random.Random(args.seed)

    def body(call: int) -> bytes:
        seq0 = call * args.size
        return json.dumps(
            {
                "messages": [
                    {"to": [uid_of(rng.choice(connected))], "content": {"seq": seq0 + j}}
                    for j in range(args.size)
                ]
            }
        ).encode()

    bodies = [body(c) for c in range(args.calls)]
    warm = [
        json.dumps({"messages": [{"to": [uid_of(k)], "content": {"seq": -1 - k}}]}).encode()
        for k in connected[:50]
    ]
    headers = {"Authorization": f"Bearer {svc.api_key}", "Content-Type": "application/json"}
    statuses: dict[int, int] = {}
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=svc.base_url, headers=headers, timeout=60) as http:
        for w in warm:
            (await http.post("/v1/push/batch", content=w)).raise_for_status()
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        for b in bodies:
            queue.put_nowait(b)

        async def sender() -> None:
            while not queue.empty():
                data = queue.get_nowait()
                t = time.monotonic()
                resp = await http.post("/v1/push/batch", content=data)
                latencies.append(time.monotonic() - t)
                for r in resp.json()["results"] if resp.status_code == 200 else []:
                    statuses[r["status"]] = statuses.get(r["status"], 0) + 1
                if resp.status_code != 200:
                    statuses[resp.status_code] = statuses.get(resp.status_code, 0) + args.size

        cpu0, _ = cpu_snapshot(pids)
        t0 = time.monotonic()
        await asyncio.gather(*(sender() for _ in range(args.concurrency)))
        sent_s = time.monotonic() - t0
        cpu1, _ = cpu_snapshot(pids)
    total = args.calls * args.size
    await link.count_up_to(total, DRAIN_TIMEOUT_S)
    dump = await link.ask("dump", 30, cmd="dump")
    times = [t for s, t in zip(dump["seqs"], dump["times"], strict=True) if s >= 0]
    wall = (max(times) - t0) if times else float("nan")
    return {
        "messages": total,
        "calls": args.calls,
        "size": args.size,
        "concurrency": args.concurrency,
        "statuses": statuses,
        "received": len(times),
        "lost": total - len(times),
        "duplicates": dump["duplicates"],
        "calls_s": sent_s,
        "delivered_s": wall,
        "messages_per_s": len(times) / wall if times else 0.0,
        "call_ms": {
            "p50": 1000 * statistics.median(latencies),
            "max": 1000 * max(latencies),
        },
        "cpu_us_per_message": {n: 1e6 * (cpu1[n] - cpu0[n]) / total for n in cpu1 if n in cpu0},
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=in_range(int, 1, 15000), default=2000)
    p.add_argument("--calls", type=in_range(int, 1, 10000), default=100, help="batches sent")
    p.add_argument("--size", type=in_range(int, 1, 1000), default=1000, help="messages a call")
    p.add_argument("--concurrency", type=in_range(int, 1, 64), default=4, help="calls in flight")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="200 clients, 10 calls")
    p.add_argument("--json", dest="json_out", action="store_true")
    return parse_run_args(p, argv, clients=200, calls=10)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main("push_batch", lambda h: _run(h, args), nofile=args.clients + 4096)


def _run(h: Harness, args: argparse.Namespace) -> None:
    internal_credentials(h.env, h.cond, "token")
    svc = start_service(h, ["g1", "g2"])
    spec = {"urls": svc.ws_urls, "indices": [0, args.clients, 1], "ack": True}
    worker = spawn_worker(h, "bench.p2p", spec)  # bench.p2p's client process
    pids = h.cpu_pids()

    async def go() -> dict[str, Any]:
        return await bench(args, h, await ChildLink(worker).open(), svc, pids)

    result = run_async(go, OVERALL_TIMEOUT_S)
    print(
        f"push_batch: {result['messages']} messages in {result['calls']} calls of "
        f"{result['size']} ({result['concurrency']} in flight): "
        f"{result['messages_per_s']:,.0f} messages/s delivered "
        f"(calls done in {result['calls_s']:.2f} s, last frame at {result['delivered_s']:.2f} s); "
        f"statuses {result['statuses']}, lost {result['lost']}, dup {result['duplicates']}; "
        f"call p50 {result['call_ms']['p50']:.0f} ms; CPU us/message "
        + ", ".join(f"{k} {v:.0f}" for k, v in result["cpu_us_per_message"].items())
    )
    print_json(args.json_out, {"conditions": h.cond, "results": result})


if __name__ == "__main__":
    sys.exit(main())
