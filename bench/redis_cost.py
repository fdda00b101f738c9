"""What one P2P push costs Redis: commands, script calls and round trips per push, and
bytes per stored message. It counts; it does not time (cheap, and safe next to another
benchmark on the same machine).

Starts a fresh redis-server on a free loopback port (no other user: INFO counts the whole
server), the push service and one gateway as real processes, and two WebSocket clients in
this process (u0, measured; u1, the warm-up's) that ack the pushes carrying a `pos` as
the SDKs do: the latest `pos`, at most one ack frame per `--ack-interval-ms`. Then:

1. `--pushes` single-recipient pushes (`POST /v1/push {"to":["u0"],"content":{...}}`, 50
   bytes of JSON content) at `--rate` per second, each waited for until u0 has it, then
   0.5 s for the gateway's last ack flush (every 50 ms). INFO commandstats and
   total_reads_processed are read before and after; the same stack, idle for the same
   wall time, is measured next and subtracted.
   Commandstats counts the commands a script runs too (EVALSHA 1 + its calls); `reads`
   (socket reads) is about one per round trip, a pipeline being one.
2. A MONITOR sample of `--sample` more pushes: round trips, and which commands came
   from a client and which from inside a script (`[0 lua]`).
3. Memory: `MEMORY USAGE key SAMPLES 0` over every key (SCAN), before and after, by key
   family: for the acked pushes of step 1, and for `--pushes` pushes to offline users
   (`--uid-chars` long uids, 64 by default; 50 per user: inside IMROUTE_INBOX_MAX).

    .venv/bin/python -m bench.redis_cost
    .venv/bin/python -m bench.redis_cost --pushes 300 --rate 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from bench.harness.cli import in_range
from bench.harness.clients import ack_frame, token_url
from bench.harness.load import make_clients, skip_missing_sniffio
from bench.harness.redis_info import RedisCounters, redis_counters
from bench.harness.report import git_commit
from bench.harness.stack import (
    HOST,
    BenchError,
    Harness,
    Service,
    run_async,
    run_main,
    start_service,
)
from bench.redis_cost_report import (
    PER_OFFLINE_USER,
    content_of,
    memory_delta,
    message_bytes,
    monitor_sources,
    net_calls,
    per,
    report,
    script_calls,
)
from router.processes.embedded_redis import find_redis_server, redis_answers
from router.processes.ports import free_port
from router.processes.supervisor import Child, Supervisor

SETTLE_S = 0.5  # past the gateway's ack flush (50 ms) and the push service's writes


# --------------------------------------------------------------------------- I/O shells


@dataclass
class Online:
    """u0 and u1 on the gateway, acking as the SDKs do (`ack_interval_s`): the latest
    `pos` at once, or when `interval_s` has passed since the last ack frame."""

    interval_s: float
    arrived: dict[int, asyncio.Event] = field(default_factory=dict)
    ws: list[Any] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    acks: int = 0

    def wait_for(self, seq: int) -> asyncio.Event:
        return self.arrived.setdefault(seq, asyncio.Event())

    async def read(self, ws: Any) -> None:
        latest: list[str] = []  # the pos not acked yet
        last_sent = -1e9

        async def send_latest() -> None:
            nonlocal last_sent
            await asyncio.sleep(max(0.0, last_sent + self.interval_s - time.monotonic()))
            last_sent = time.monotonic()
            self.acks += 1
            await ws.send(ack_frame(latest.pop()).decode())

        async for data in ws:
            frame = json.loads(data)
            if frame.get("type") == "recovered":
                continue
            if frame.get("pos"):
                if not latest:
                    self.tasks.append(asyncio.create_task(send_latest()))
                latest[:] = [str(frame["pos"])]
            self.wait_for(int(frame["content"]["seq"])).set()


async def connect_online(url: str, secret: str, interval_s: float) -> Online:
    from websockets.asyncio.client import connect

    online = Online(interval_s)
    for k in (0, 1):
        ws = await connect(token_url(url, k, secret), compression=None, proxy=None)
        online.ws.append(ws)
        online.tasks.append(asyncio.create_task(online.read(ws)))
    return online


async def push(client: httpx.AsyncClient, uid: str, seq: int) -> None:
    body = {"to": [uid], "content": content_of(seq)}
    resp = await client.post("/v1/push", content=json.dumps(body, separators=(",", ":")))
    if resp.status_code != 200:
        raise BenchError(f"push to {uid} answered {resp.status_code}: {resp.text[:200]}")


async def acked_pushes(
    client: httpx.AsyncClient, online: Online, seqs: range, rate: float, uid: str = "u0"
) -> None:
    """Pushes to an online uid on a schedule of `rate`/s, each waited for until acked."""
    start = time.monotonic()
    for i, seq in enumerate(seqs):
        await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
        await push(client, uid, seq)
        try:
            await asyncio.wait_for(online.wait_for(seq).wait(), 5)
        except TimeoutError:
            raise BenchError(f"push {seq} did not reach {uid} within 5 s") from None


def memory_snapshot(url: str) -> dict[str, int]:
    """key -> MEMORY USAGE (SAMPLES 0: every element counted) of every key."""
    client = redis.Redis.from_url(url, socket_timeout=30, decode_responses=True)
    try:
        keys = list(client.scan_iter(count=1000))
        sizes: dict[str, int] = {}
        for i in range(0, len(keys), 500):
            pipe = client.pipeline(transaction=False)
            for key in keys[i : i + 500]:
                pipe.memory_usage(key, samples=0)
            for key, size in zip(keys[i : i + 500], pipe.execute(), strict=True):
                if size is not None:  # gone since the SCAN
                    sizes[key] = int(size)
        return sizes
    finally:
        client.close()


def counters(url: str) -> RedisCounters:
    got = redis_counters(url)
    if got is None:
        raise BenchError("Redis did not answer INFO")
    return got


async def monitored(url: str, work: Any) -> list[str]:
    """The MONITOR lines Redis printed while `work` (a coroutine) ran."""
    host, port = url.removeprefix("redis://").split("/")[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"MONITOR\r\n")
    await reader.readline()  # +OK
    lines: list[str] = []

    async def read() -> None:
        while line := await reader.readline():
            lines.append(line.decode(errors="replace").rstrip())

    task = asyncio.create_task(read())
    try:
        await work
        await asyncio.sleep(SETTLE_S)
    finally:
        task.cancel()
        writer.close()
    return lines


async def measure(h: Harness, svc: Service, opts: argparse.Namespace) -> dict[str, Any]:
    n, url, prefix = opts.pushes, h.redis_url, h.prefix
    online = await connect_online(
        svc.ws_urls[0], h.env["IMROUTE_SECRET"], opts.ack_interval_ms / 1000
    )
    await h.wait_routes(["u0", "u1"])
    skip_missing_sniffio()
    client = make_clients(svc.base_url, svc.api_key, 1)[0]
    try:
        # Warm-up to u1: opens the connections and loads the scripts; u0's keys stay new.
        await acked_pushes(client, online, range(-50, 0), 1e9, uid="u1")
        await asyncio.sleep(SETTLE_S)
        mem0 = memory_snapshot(url)
        c0, t0, acks0 = counters(url), time.monotonic(), online.acks
        await acked_pushes(client, online, range(n), opts.rate)
        await asyncio.sleep(SETTLE_S)
        c1, wall, ack_frames = counters(url), time.monotonic() - t0, online.acks - acks0
        mem1 = memory_snapshot(url)
        i0 = counters(url)
        await asyncio.sleep(wall)
        idle = counters(url).minus(i0)
        busy = c1.minus(c0)
        sample = range(n, n + opts.sample)
        lines = await monitored(url, acked_pushes(client, online, sample, opts.rate))
        # Offline users: never connected; their pushes are stored (log and inbox).
        uids = [f"off{k:0{opts.uid_chars - 3}d}" for k in range(-(-n // PER_OFFLINE_USER))]
        mem2, o0, t2 = memory_snapshot(url), counters(url), time.monotonic()
        for seq in range(n):
            await push(client, uids[seq // PER_OFFLINE_USER], 100_000 + seq)
        await asyncio.sleep(SETTLE_S)
        o1, wall2 = counters(url), time.monotonic() - t2
        mem3 = memory_snapshot(url)
    finally:
        await client.aclose()
        for ws in online.ws:
            await ws.close()
        for task in online.tasks:
            task.cancel()
    calls = net_calls(busy.calls, idle.calls)
    sources = monitor_sources(lines)
    acked_mem = memory_delta(mem0, mem1, prefix)
    offline_mem = memory_delta(mem2, mem3, prefix)
    offline, scale = o1.minus(o0), wall2 / wall  # the idle run, scaled to this one's time
    offline_calls = net_calls(offline.calls, {c: round(v * scale) for c, v in idle.calls.items()})
    return {
        "pushes": n,
        "rate": opts.rate,
        "wall_s": round(wall, 2),
        "ack_interval_ms": opts.ack_interval_ms,
        "ack_frames": ack_frames,
        "acked_push": {
            "commands": round(sum(calls.values()) / n, 3),
            "script_calls": round(script_calls(calls) / n, 3),
            "round_trips": round((busy.reads - idle.reads) / n, 3),
            "calls": per(calls, n),
            "idle_commands_per_s": round(sum(idle.calls.values()) / wall, 2),
        },
        "monitor_sample": {
            "pushes": opts.sample,
            "client": per(dict(sorted(sources["client"].items())), opts.sample),
            "script": per(dict(sorted(sources["script"].items())), opts.sample),
            "round_trips": round(sources["round_trips"] / opts.sample, 2),
        },
        "offline_push": {
            "commands": round(sum(offline_calls.values()) / n, 3),
            "script_calls": round(script_calls(offline_calls) / n, 3),
            "round_trips": round((offline.reads - idle.reads * scale) / n, 3),
            "calls": per(offline_calls, n),
        },
        "bytes_per_acked_message": round(message_bytes(acked_mem) / n, 1),
        "bytes_per_offline_message": round(message_bytes(offline_mem) / n, 1),
        "offline_users": len(uids),
        "memory_acked": acked_mem,
        "memory_offline": offline_mem,
    }


# --------------------------------------------------------------------------- entry point


def fresh_redis(sup: Supervisor, workdir: Path) -> tuple[Child, str]:
    """A redis-server of our own on a free loopback port, configured as `imroute dev`'s."""
    port = free_port()
    argv = [find_redis_server(), "--port", str(port), "--bind", HOST, "--save", "",
            "--appendonly", "yes", "--appendfsync", "everysec", "--dir", str(workdir)]  # fmt: skip
    child = sup.start("redis-server", argv, stdout="null", stderr="null")
    url = f"redis://{HOST}:{port}/0"
    deadline = time.monotonic() + 10
    while not redis_answers(url, 0.5):
        if child.poll() is not None or time.monotonic() > deadline:
            raise BenchError("the fresh redis-server did not start")
        time.sleep(0.05)
    return child, url


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--pushes", type=in_range(int, 1, 1000), default=1000,
        help="pushes per measurement (default 1000; at most IMROUTE_RECOVERY_USER_MAX)",
    )  # fmt: skip
    p.add_argument("--rate", type=in_range(float, 1, 1000), default=100.0,
                   help="acked pushes per second (default 100)")  # fmt: skip
    p.add_argument("--ack-interval-ms", type=in_range(int, 0, 1000), default=100,
                   help="at most one ack frame per this (default 100, the SDKs'; a gateway"
                   " takes 20 frames/s, burst 50)")  # fmt: skip
    p.add_argument("--uid-chars", type=in_range(int, 8, 128), default=64,
                   help="length of the offline users' uids (default 64)")  # fmt: skip
    p.add_argument("--sample", type=in_range(int, 1, 100), default=20,
                   help="pushes watched with MONITOR (default 20)")  # fmt: skip
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    sup, workdir = Supervisor(), Path(tempfile.mkdtemp(prefix="imroute-redis-cost-"))
    try:
        child, url = fresh_redis(sup, workdir)
    except BenchError as exc:
        print(f"redis_cost bench: {exc}", file=sys.stderr)
        return 1
    os.environ["IMROUTE_REDIS_URL"] = url  # run_main takes an answering Redis as it is
    try:
        return run_main("redis_cost", lambda h: _run(h, opts, child.pid))
    finally:
        sup.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)


def _run(h: Harness, opts: argparse.Namespace, redis_pid: int) -> None:
    h.cond |= {"redis": f"fresh redis-server (pid {redis_pid}) at {h.redis_url}"}
    h.cond["commit"] = git_commit()
    svc = start_service(h, ["g1"])
    result = run_async(lambda: measure(h, svc, opts), 600)
    report(result, h.cond)
    print(json.dumps({"conditions": h.cond, "results": result}))


if __name__ == "__main__":
    sys.exit(main())
