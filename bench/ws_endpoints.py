"""Idle memory per connection and fan-out speed of the two gateway WebSocket endpoints.

Compares imroute's endpoint, `socket_gateway.ws.WsEndpoint` (asyncio.Protocol +
sans-I/O), with the baseline in `bench/websockets_endpoint.py` (the same behaviour on the
`websockets` asyncio server, which the gateway used before), each on the
default asyncio loop and on uvloop. Per configuration:

1. a gateway-side child process serves the endpoint alone on a free loopback port, with a
   LocalConnections map and no-op (awaiting) register/unregister coroutines, so the
   numbers are the endpoint's and not Redis's or gRPC's;
2. client child processes (always uvloop, hand-rolled asyncio.Protocol clients that
   answer pings, so the client side stays cheap) connect N clients, one uid each;
3. idle RSS: VmRSS of the gateway process (after gc.collect()) with the endpoint serving
   and no connections, then again with all N connected, registered and idle for a
   settle period -> KiB per connection;
4. fan-out rounds: the gateway writes ONE pre-built ~180-byte push frame to every
   connection with LocalConnections.deliver; it reports the deliver() time (frames/s =
   N / that time) and the clients report when their last connection got the frame
   (broadcast latency = last arrival - deliver start, both CLOCK_MONOTONIC). Each client
   counts the frames of each round per connection: exactly once is checked.

Every child is stopped by its PID at the end, on errors and on Ctrl-C.

    .venv/bin/python -m bench.ws_endpoints                      # 10000 connections, 4 configs
    .venv/bin/python -m bench.ws_endpoints --quick              # 2000 connections, 2 rounds
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness.cli import parse_run_args
from bench.harness.link import ChildLink, emit, stdin_commands
from bench.harness.stack import HOST, bench_argv, raise_nofile, run_loop
from bench.harness.stats import vm_kib
from bench.ws_clients import SECRET, client_side, frame_of
from router.processes.supervisor import Supervisor

STEP_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 180.0
ROUND_TIMEOUT_S = 20.0
SETTLE_S = 2.0
ENDPOINTS = ("websockets", "sansio")
LOOPS = ("asyncio", "uvloop")


# --------------------------------------------------------------------------- gateway side


async def gateway_side(endpoint: str, clients: int) -> None:
    from shared.clock import SystemClock
    from shared.ids import ConnIdFactory
    from socket_gateway.connections import LocalConnections

    raise_nofile(clients + 1024)
    conns = LocalConnections()
    registered = 0

    async def register(uid: str, conn_id: str) -> None:
        nonlocal registered
        await asyncio.sleep(0)
        registered += 1

    async def unregister(uid: str, conn_id: str) -> None:
        await asyncio.sleep(0)

    if endpoint == "sansio":
        from socket_gateway.ws.admission import HandshakeLimits
        from socket_gateway.ws.endpoint import WsEndpoint

        # Every client process connects from the one loopback address.
        one_address = HandshakeLimits(max_pre_auth_per_ip=HandshakeLimits().max_pre_auth)
        ep: Any = WsEndpoint(
            conns, SECRET, SystemClock(), ConnIdFactory("gwb"), register, unregister,
            limits=one_address,
        )  # fmt: skip
    else:
        from bench.websockets_endpoint import WsEndpoint as WebsocketsEndpoint

        ep = WebsocketsEndpoint(
            conns, SECRET, SystemClock(), ConnIdFactory("gwb"), register, unregister
        )
    server = await ep.serve(HOST, 0)
    port = server.sockets[0].getsockname()[1]
    gc.collect()
    emit(event="ready", port=port, pid=os.getpid(), loop=type(asyncio.get_running_loop()).__name__)
    async for msg in stdin_commands():
        cmd, args = msg["cmd"], msg.get("args", [])
        if cmd == "rss":
            gc.collect()
            emit(event="rss", rss_kib=vm_kib()["VmRSS"], conns=len(conns), registered=registered)
        elif cmd == "deliver":
            frame = frame_of(int(args[0]))
            uids = [c.uid for c in conns]
            gc.collect()
            t0 = time.monotonic()
            delivered, missing = conns.write_to(uids, frame)
            t1 = time.monotonic()
            emit(
                event="delivered",
                t0=t0,
                deliver_s=t1 - t0,
                frames=len(delivered),
                missing=len(missing),
                frame_bytes=len(frame),
                slow_aborted=conns.slow_aborted,
            )
        elif cmd == "close":
            t0 = time.monotonic()
            server.close(close_connections=True)
            await asyncio.wait_for(server.wait_closed(), 30)
            emit(event="closed", close_s=time.monotonic() - t0, conns=len(conns))
            return


# --------------------------------------------------------------------------- orchestrator


class Child:
    """A child of one configuration: text commands in, JSON events out."""

    def __init__(self, link: ChildLink) -> None:
        self.link = link

    async def send(self, line: str) -> None:
        cmd, *args = line.split()
        self.link.send(cmd=cmd, args=[int(a) for a in args])

    async def recv(self, event: str, timeout: float = STEP_TIMEOUT_S) -> dict[str, Any]:
        return await self.link.expect(event, timeout)

    async def ask(self, line: str, event: str, timeout: float = STEP_TIMEOUT_S) -> dict[str, Any]:
        await self.send(line)
        return await self.recv(event, timeout)


def cpu_split(pin: bool) -> tuple[set[int] | None, set[int] | None]:
    """CPUs for the gateway side and for the clients: apart when there are two or more."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return None, None
    return {cpus[0]}, set(cpus[1:])


async def spawn(sup: Supervisor, name: str, *args: str, cpus: set[int] | None = None) -> Child:
    child = sup.start(name, bench_argv("bench.ws_endpoints", *args), stdin="pipe", stdout="pipe")
    if cpus:
        os.sched_setaffinity(child.pid, cpus)
    return Child(await ChildLink(child).open())


async def one_config(
    endpoint: str, loop_name: str, n: int, procs: int, rounds: int, parallel: int, pin: bool
) -> dict[str, Any]:
    gw_cpus, client_cpus = cpu_split(pin)
    sup = Supervisor()
    children: list[Child] = []
    try:
        gw = await spawn(sup, "gateway", "_gateway", endpoint, loop_name, str(n), cpus=gw_cpus)
        children.append(gw)
        ready = await gw.recv("ready")
        port, gw_pid = ready["port"], ready["pid"]
        shares = [n // procs + (1 if k < n % procs else 0) for k in range(procs)]
        firsts = [sum(shares[:k]) for k in range(procs)]
        clients = []
        for k in range(procs):
            c = await spawn(
                sup,
                f"clients{k}",
                "_clients",
                str(port),
                str(firsts[k]),
                str(shares[k]),
                cpus=client_cpus,
            )
            children.append(c)
            clients.append(c)
            await c.recv("ready")
        base = await gw.ask("rss", "rss")
        t0 = time.monotonic()
        for c in clients:
            await c.send(f"connect {parallel}")
        connected = [await c.recv("connected", CONNECT_TIMEOUT_S) for c in clients]
        connect_s = time.monotonic() - t0
        opened = sum(m["open"] for m in connected)
        failed = sum(m["failed"] for m in connected)
        # Wait until every connection is in the map and its register returned.
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while True:
            st = await gw.ask("rss", "rss")
            if st["conns"] >= opened and st["registered"] >= opened:
                break
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(SETTLE_S)
        idle = await gw.ask("rss", "rss")
        results: list[dict[str, Any]] = []
        for r in range(rounds):
            for c in clients:
                await c.ask(f"arm {r}", "armed")
            d = await gw.ask(f"deliver {r}", "delivered")
            got = []
            for c in clients:
                got.append(await c.ask("wait", "got", ROUND_TIMEOUT_S + 5))
            count = sum(g["count"] for g in got)
            last = max((g["last"] for g in got), default=0.0)
            results.append(
                {
                    "deliver_s": d["deliver_s"],
                    "frames": d["frames"],
                    "missing": d["missing"],
                    "received": count,
                    "dups": sum(g["dups"] for g in got),
                    "wrong": sum(g["wrong"] for g in got),
                    "latency_s": (last - d["t0"]) if count else float("nan"),
                    "frame_bytes": d["frame_bytes"],
                }
            )
            await asyncio.sleep(0.3)
        after = await gw.ask("rss", "rss")
        closed = await gw.ask("close", "closed", 60)
        return {
            "endpoint": endpoint,
            "loop": loop_name,
            "clients": n,
            "opened": opened,
            "failed": failed,
            "connect_s": connect_s,
            "gw_pid": gw_pid,
            "rss_base_kib": base["rss_kib"],
            "rss_idle_kib": idle["rss_kib"],
            "rss_after_kib": after["rss_kib"],
            "conns": idle["conns"],
            "kib_per_conn": (idle["rss_kib"] - base["rss_kib"]) / max(1, idle["conns"]),
            "rounds": results,
            "close_s": closed["close_s"],
        }
    finally:
        for c in children:
            c.link.close()
        # Their stdin closed, the children end by themselves; the rest are stopped by PID.
        await asyncio.sleep(0.2)
        sup.stop_all(grace_s=5.0)


def summarize(res: dict[str, Any]) -> str:
    rounds = res["rounds"]
    ok = [r for r in rounds if r["received"] == r["frames"] and not r["dups"] and not r["wrong"]]
    fps = sorted(r["frames"] / r["deliver_s"] for r in rounds if r["deliver_s"] > 0)
    lat = sorted(r["latency_s"] for r in rounds)
    return (
        f"{res['endpoint']:>10} {res['loop']:>7} | conns {res['conns']:>6} "
        f"(failed {res['failed']}) | idle {res['kib_per_conn']:6.2f} KiB/conn "
        f"(RSS {res['rss_base_kib'] / 1024:.1f} -> {res['rss_idle_kib'] / 1024:.1f} MiB) | "
        f"deliver {statistics.median(fps):>10,.0f} frames/s (best {fps[-1]:,.0f}) | "
        f"broadcast latency median {statistics.median(lat) * 1000:6.1f} ms "
        f"(best {lat[0] * 1000:.1f}) | exactly-once {len(ok)}/{len(rounds)} rounds"
    )


async def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    raise_nofile(4096)
    cond = {
        "python": platform.python_version(),
        "kernel": platform.release(),
        "nproc": len(os.sched_getaffinity(0)),
        "clients": args.clients,
        "client_procs": args.client_procs,
        "rounds": args.rounds,
        "frame_bytes": len(frame_of(0)),
        "parallel_handshakes_per_client_proc": args.parallel,
        "register": "no-op coroutine (await asyncio.sleep(0))",
        "client": "uvloop, raw asyncio.Protocol clients (answer pings)",
        "cpus (gateway, clients)": [sorted(c) if c else "any" for c in cpu_split(not args.no_pin)],
    }
    print("conditions:", json.dumps(cond))
    all_results = []
    for loop_name in args.loops:
        for endpoint in args.endpoints:
            res = await asyncio.wait_for(
                one_config(
                    endpoint,
                    loop_name,
                    args.clients,
                    args.client_procs,
                    args.rounds,
                    args.parallel,
                    not args.no_pin,
                ),
                args.config_timeout,
            )
            all_results.append(res)
            print(summarize(res), flush=True)
    return {"conditions": cond, "results": all_results}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_gateway":
        _, _, endpoint, loop_name, n = sys.argv
        run_loop(gateway_side(endpoint, int(n)), loop_name)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_clients":
        _, _, port, first, count = sys.argv
        run_loop(client_side(int(port), int(first), int(count)), "uvloop")
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--clients", type=int, default=10_000)
    p.add_argument("--client-procs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--parallel", type=int, default=64, help="handshakes in flight per process")
    p.add_argument("--endpoints", nargs="+", default=list(ENDPOINTS), choices=ENDPOINTS)
    p.add_argument("--loops", nargs="+", default=list(LOOPS), choices=LOOPS)
    p.add_argument("--config-timeout", type=float, default=300.0)
    p.add_argument("--json", help="also write all results to this file")
    p.add_argument(
        "--no-pin", action="store_true", help="do not put the gateway and clients on own CPUs"
    )
    p.add_argument("--quick", action="store_true", help="2000 clients, 2 rounds")
    args = parse_run_args(p, None, clients=2000, rounds=2)
    report = asyncio.run(orchestrate(args))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
