"""Webhook throughput benchmark: `message.unacked` for a large multicast, half offline.

Starts a push service and gateways as child processes (one gateway per 17,000 online
clients; a unique Redis key prefix), a signed-webhook receiver in this process (it
checks every request's HMAC, as an app's server would), and `--online` real WebSocket
clients, in client processes of their own, that ack every push. Then one
`POST /v1/multicast` to `--recipients` uids, of which the first `--online` are
connected and the rest have never connected (offline). After IMROUTE_WEBHOOK_UNACKED_S
(`--unacked-s`, 5 s) the push service's sweeper names every recipient no device acked:
the offline ones, 1000 per event, through the outbox and its sender.

It reports the time from the multicast's 202 to its job's end, to the first and to the
last event, the events, POSTs and bytes, and recipients named per second from the
first event to the last (the webhook pipeline's throughput: sweep, outbox, sender,
signing, receiver), plus the push service's and Redis's CPU over the whole run. It
checks that the events name exactly the offline recipients, each once.

    .venv/bin/python -m bench.webhook --quick
    .venv/bin/python -m bench.webhook --recipients 100000 --online 50000
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import secrets
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.harness.cli import parse_run_args
from bench.harness.clients import ack_frame, send_now, spec_pool, uid_of
from bench.harness.link import ChildLink, emit, stdin_commands
from bench.harness.report import machine_lines, print_json
from bench.harness.stack import HOST, BenchError, Harness, run_async, run_main, start_stack
from bench.harness.stats import cpu_seconds
from bench.harness.workers import add_worker_flag, serve_worker, spawn_worker
from router.processes.ports import free_port

API_KEY = "bench-api-key-" + secrets.token_hex(8)
HOOK_SECRET = "whsec-bench-" + secrets.token_hex(8)


@dataclass
class Receiver:
    """A minimal HTTP/1.1 webhook receiver that verifies each signature."""

    events: int = 0
    posts: int = 0
    size: int = 0
    bad: int = 0
    uids: list[str] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    duplicates: int = 0
    first_at: float = 0.0
    last_at: float = 0.0
    port: int = 0

    async def start(self) -> asyncio.Server:
        server = await asyncio.start_server(self._serve, HOST, 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                headers = {
                    k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                ok = self._take(body, headers.get("x-imroute-signature", ""))
                status = b"200 OK" if ok else b"400 Bad Request"
                writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()

    def _take(self, body: bytes, header: str) -> bool:
        parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
        t = parts.get("t", "0")
        mac = hmac.new(HOOK_SECRET.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(mac, parts.get("v1", "")) or abs(time.time() - int(t)) > 300:
            self.bad += 1
            return False
        now = time.monotonic()
        self.first_at = self.first_at or now
        self.last_at = now
        self.posts += 1
        self.size += len(body)
        for event in json.loads(body)["events"]:
            if event["event_id"] in self.ids:
                self.duplicates += 1
                continue
            self.ids.add(event["event_id"])
            if event["type"] == "message.unacked":
                self.events += 1
                self.uids.extend(event["uids"])
        return True


# Clients per client process and per gateway: the hard RLIMIT_NOFILE here is 20,000,
# and one loopback destination port has ~28k source ports (the ephemeral range).
PER_PROCESS = 17_000


async def _worker(spec: dict[str, Any]) -> None:
    """A client process: connects its clients on 'go', acks every push as it arrives."""
    acks = {"sent": 0}

    def on_frame(conn: Any, _now: float, data: bytes) -> None:
        frame = json.loads(data)
        if frame.get("type") == "push" and send_now(conn, ack_frame(str(frame["pos"]))):
            acks["sent"] += 1

    pool = spec_pool(spec, on_frame)
    async for cmd in stdin_commands():
        if cmd["cmd"] == "go":
            failed = await pool.start()
            emit(event="ready", failed=len(failed))
        elif cmd["cmd"] == "count":
            emit(event="count", n=acks["sent"])
    pool.stop()
    os._exit(0)


def run(h: Harness, args: argparse.Namespace) -> dict[str, Any]:
    http_port = free_port()
    n = max(1, -(-args.online // PER_PROCESS))  # as many gateways as client processes
    gateways = [(f"gw{i + 1}", "g1", free_port(), free_port()) for i in range(n)]
    h.env.update(
        IMROUTE_API_KEY=API_KEY,
        IMROUTE_WEBHOOK_SECRET=HOOK_SECRET,
        IMROUTE_WEBHOOK_UNACKED_S=str(args.unacked_s),
        IMROUTE_GATEWAY_MAX_CONNECTIONS=str(PER_PROCESS + 1000),
    )

    async def body() -> dict[str, Any]:
        rx = Receiver()
        server = await rx.start()
        h.env["IMROUTE_WEBHOOK_URL"] = f"http://{HOST}:{rx.port}/hooks"
        start_stack(h.stack, http_port, gateways, API_KEY)
        urls = [f"ws://{HOST}:{g[2]}/ws" for g in gateways]
        links = []
        for i in range(n):  # client process i takes clients i, i+n, ...: all on gateway i
            spec = {"urls": [urls[i]], "indices": [i, args.online, n]}
            child = spawn_worker(h, "bench.webhook", spec, f"clients{i}")
            links.append(await ChildLink(child).open())
        began = time.monotonic()
        for link in links:
            link.send(cmd="go")
        for link in links:
            ready = await link.expect("ready", 300)
            if ready["failed"]:
                raise BenchError(f"{ready['failed']} clients of {link.name} could not connect")
        await h.wait_routes([uid_of(k) for k in range(args.online)])
        connect_s = time.monotonic() - began
        to = [uid_of(k) for k in range(args.recipients)]
        pids = {name: h.stack.pid(name) for name in ("push-service", *(g[0] for g in gateways))}
        if h.redis_pid:
            pids["redis"] = h.redis_pid
        cpu0 = {k: cpu_seconds(p) or 0.0 for k, p in pids.items()}
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with httpx.AsyncClient(base_url=f"http://{HOST}:{http_port}", timeout=60) as http:
            t0 = time.monotonic()
            resp = await http.post(
                "/v1/multicast", json={"to": to, "content": "hi"}, headers=headers
            )
            if resp.status_code != 202:
                raise BenchError(f"multicast answered {resp.status_code}: {resp.text[:200]}")
            push_id = resp.json()["push_id"]
            while True:
                status = (await http.get(f"/v1/pushes/{push_id}", headers=headers)).json()
                if status["status"] in ("done", "failed"):
                    break
                await asyncio.sleep(0.05)
            job_s = time.monotonic() - t0
            offline = args.recipients - args.online
            deadline = time.monotonic() + args.timeout
            while True:
                if len(rx.uids) >= offline or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(2.0)  # anything more would be a duplicate or a stray
            final = (await http.get(f"/v1/pushes/{push_id}", headers=headers)).json()
        cpu = {k: (cpu_seconds(p) or 0.0) - cpu0[k] for k, p in pids.items()}
        acks_sent = sum([(await link.ask("count", 30, cmd="count"))["n"] for link in links])
        for link in links:
            link.close()
        server.close()
        named = sorted(rx.uids)
        expected = sorted(to[args.online :])
        span = rx.last_at - rx.first_at
        return {
            "recipients": args.recipients,
            "online": args.online,
            "offline": offline,
            "connect_s": round(connect_s, 1),
            "job_s": round(job_s, 2),
            "first_event_s": round(rx.first_at - t0, 2) if rx.first_at else None,
            "last_event_s": round(rx.last_at - t0, 2) if rx.last_at else None,
            "events": rx.events,
            "posts": rx.posts,
            "mib": round(rx.size / 2**20, 2),
            "uids_per_s": round(len(named) / span) if span > 0 else None,
            "events_per_s": round(rx.events / span, 1) if span > 0 else None,
            "exact": named == expected,
            "named": len(named),
            "duplicates": rx.duplicates,
            "bad_signatures": rx.bad,
            "acks_sent": acks_sent,
            "receipt": {k: final.get(k) for k in ("delivered", "acked", "queued", "listable")},
            "cpu_s": {n: round(v, 2) for n, v in cpu.items()},
            "status": status["status"],
        }

    return run_async(body, args.timeout + 600)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.webhook", description=__doc__.split("\n")[0])
    p.add_argument("--recipients", type=int, default=100_000)
    p.add_argument("--online", type=int, default=50_000)
    p.add_argument("--timeout", type=float, default=120.0, help="for the last event, s")
    p.add_argument(
        "--unacked-s", type=int, default=5, help="IMROUTE_WEBHOOK_UNACKED_S: time to ack"
    )
    p.add_argument("--quick", action="store_true", help="10,000 recipients, 5,000 online")
    p.add_argument("--json", action="store_true")
    add_worker_flag(p)
    args = parse_run_args(p, argv, recipients=10_000, online=5_000)
    if args.worker:
        return serve_worker(_worker, args.worker)
    if not 0 <= args.online < args.recipients:
        p.error("--online must be below --recipients")

    def body(h: Harness) -> None:
        result = run(h, args)
        for line in machine_lines(h.cond):
            print(line)
        for k, v in result.items():
            print(f"{k}: {v}")
        print_json(args.json, {"conditions": h.cond, "result": result})
        if not result["exact"] or result["duplicates"] or result["bad_signatures"]:
            raise BenchError("the events did not name exactly the offline recipients once")

    return run_main("webhook", body, nofile=20_000)


if __name__ == "__main__":
    sys.exit(main())
