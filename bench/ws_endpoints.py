"""Idle memory per connection and fan-out speed of the two gateway WebSocket endpoints.

Compares imroute's endpoint, `socket_gateway.ws_server.WsEndpoint` (asyncio.Protocol +
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

    .venv/bin/python bench/ws_endpoints.py                      # 10000 connections, 4 configs
    .venv/bin/python bench/ws_endpoints.py --clients 2000 --rounds 3 --quick
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(SCRIPT.parent))
from p2p import raise_nofile  # noqa: E402  # the benchmarks share their helpers

HOST = "127.0.0.1"
SECRET = "bench-secret-0123456789abcdef-0123456789"
FRAME_BYTES = 180
STEP_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 180.0
ROUND_TIMEOUT_S = 20.0
SETTLE_S = 2.0
ENDPOINTS = ("websockets", "sansio")
LOOPS = ("asyncio", "uvloop")


def vm_rss_kib(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def emit(**msg: Any) -> None:
    sys.stdout.write(json.dumps(msg, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def run(main: Awaitable[None], loop_name: str) -> None:
    if loop_name == "uvloop":
        import uvloop

        uvloop.run(main)  # type: ignore[arg-type]
    else:
        asyncio.run(main)  # type: ignore[arg-type]


async def stdin_lines() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


def uid_of(k: int) -> str:
    return f"u{k:06d}"


def frame_of(round_no: int) -> bytes:
    """A push frame of exactly FRAME_BYTES bytes whose content names the round."""
    from shared.models import Message
    from shared.wire import encode_push_json, ws_text_frame

    def build(pad: int) -> bytes:
        content = json.dumps({"round": f"{round_no:06d}", "text": "x" * pad}).encode()
        msg = Message("m" * 16, "p" * 16, 1, "bench", content, 1_700_000_000_000)
        return ws_text_frame(encode_push_json(msg))

    # Frames of 126+ payload bytes have a 4-byte header.
    return build(FRAME_BYTES - len(build(0)))


def round_marker(round_no: int) -> bytes:
    return b'"round": "%06d"' % round_no


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
        from socket_gateway.ws_server import WsEndpoint

        ep: Any = WsEndpoint(
            conns, SECRET, SystemClock(), ConnIdFactory("gwb"), register, unregister
        )
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from websockets_endpoint import WsEndpoint as WebsocketsEndpoint

        ep = WebsocketsEndpoint(
            conns, SECRET, SystemClock(), ConnIdFactory("gwb"), register, unregister
        )
    server = await ep.serve(HOST, 0)
    port = server.sockets[0].getsockname()[1]
    gc.collect()
    emit(event="ready", port=port, pid=os.getpid(), loop=type(asyncio.get_running_loop()).__name__)
    lines = await stdin_lines()
    while line := (await lines.readline()).decode().strip():
        cmd, *args = line.split()
        if cmd == "rss":
            gc.collect()
            emit(event="rss", rss_kib=vm_rss_kib(), conns=len(conns), registered=registered)
        elif cmd == "deliver":
            frame = frame_of(int(args[0]))
            uids = [c.uid for c in conns]
            gc.collect()
            t0 = time.monotonic()
            delivered, missing = conns.deliver(uids, frame)
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


# --------------------------------------------------------------------------- client side


class Pool:
    """The client connections of one client process and what each got per round."""

    def __init__(self, n: int) -> None:
        self.open = 0
        self.failed = 0
        self.closed = 0
        self.round = -1
        self.marker = b"-"
        self.got = bytearray(n)  # frames of the current round, per connection
        self.count = 0
        self.dups = 0
        self.wrong = 0
        self.last = 0.0
        self.expected = 0
        self.done: asyncio.Future[None] | None = None

    def on_text(self, idx: int, payload: bytes) -> None:
        if self.marker not in payload:
            self.wrong += 1
            return
        seen = self.got[idx]
        self.got[idx] = min(seen + 1, 255)
        if seen:
            self.dups += 1
            return
        self.count += 1
        self.last = time.monotonic()
        if self.count == self.expected and self.done is not None and not self.done.done():
            self.done.set_result(None)


class RawWs(asyncio.Protocol):
    """A minimal WebSocket client: handshake, unmasked server frames, pong, close echo."""

    __slots__ = ("buf", "idx", "opened", "pool", "request", "transport", "upgraded")

    def __init__(self, pool: Pool, idx: int, request: bytes, opened: asyncio.Future[bool]):
        self.pool = pool
        self.idx = idx
        self.request = request
        self.opened: asyncio.Future[bool] | None = opened
        self.buf = b""
        self.upgraded = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(self.request)  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        if not self.upgraded:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.buf = buf
                return
            ok = buf.startswith(b"HTTP/1.1 101 ")
            self.upgraded = ok
            if self.opened is not None and not self.opened.done():
                self.opened.set_result(ok)
            self.opened = None
            if not ok:
                self.transport.close()  # type: ignore[union-attr]
                return
            self.pool.open += 1
            buf = buf[end + 4 :]
        pos, n = 0, len(buf)
        while n - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            size, head = b1 & 0x7F, 2
            if size == 126:
                if n - pos < 4:
                    break
                size, head = int.from_bytes(buf[pos + 2 : pos + 4], "big"), 4
            elif size == 127:
                if n - pos < 10:
                    break
                size, head = int.from_bytes(buf[pos + 2 : pos + 10], "big"), 10
            if n - pos < head + size:
                break
            payload = buf[pos + head : pos + head + size]
            pos += head + size
            opcode = b0 & 0x0F
            if opcode == 0x1:
                self.pool.on_text(self.idx, payload)
            elif opcode == 0x9:  # ping -> pong, masked with a zero key
                self.transport.write(bytes((0x8A, 0x80 | size)) + b"\0\0\0\0" + payload)  # type: ignore[union-attr]
            elif opcode == 0x8:
                self.transport.write(bytes((0x88, 0x80 | size)) + b"\0\0\0\0" + payload)  # type: ignore[union-attr]
                self.transport.close()  # type: ignore[union-attr]
                self.pool.closed += 1
                return
        self.buf = buf[pos:]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.opened is not None and not self.opened.done():
            self.opened.set_result(False)
        if self.upgraded:
            self.pool.open -= 1


async def client_side(port: int, first: int, count: int) -> None:
    from shared.auth import issue_token
    from shared.clock import SystemClock

    raise_nofile(count + 1024)
    loop = asyncio.get_running_loop()
    pool = Pool(count)
    clock = SystemClock()
    lines = await stdin_lines()
    emit(event="ready", pid=os.getpid())
    while line := (await lines.readline()).decode().strip():
        cmd, *args = line.split()
        if cmd == "connect":
            t0 = time.monotonic()
            sem = asyncio.Semaphore(int(args[0]))

            async def one(i: int, sem: asyncio.Semaphore) -> None:
                tok = issue_token(SECRET, uid_of(first + i), 3600, clock)
                req = (
                    f"GET /ws?token={tok} HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
                    "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                    "Sec-WebSocket-Version: 13\r\n\r\n"
                ).encode()
                async with sem:
                    opened: asyncio.Future[bool] = loop.create_future()
                    try:
                        await loop.create_connection(
                            lambda: RawWs(pool, i, req, opened), HOST, port
                        )
                        ok = await asyncio.wait_for(opened, 30)
                    except (OSError, TimeoutError):
                        ok = False
                    if not ok:
                        pool.failed += 1

            await asyncio.gather(*(one(i, sem) for i in range(count)))
            emit(event="connected", open=pool.open, failed=pool.failed, s=time.monotonic() - t0)
        elif cmd == "arm":
            pool.round = int(args[0])
            pool.marker = round_marker(pool.round)
            pool.got = bytearray(count)
            pool.count = pool.dups = pool.wrong = 0
            pool.last = 0.0
            pool.expected = pool.open
            pool.done = loop.create_future()
            emit(event="armed")
        elif cmd == "wait":
            assert pool.done is not None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pool.done), ROUND_TIMEOUT_S)
            await asyncio.sleep(0.2)  # time for any duplicate to show up
            emit(
                event="got",
                count=pool.count,
                expected=pool.expected,
                last=pool.last,
                dups=pool.dups,
                wrong=pool.wrong,
            )
        elif cmd == "status":
            emit(event="status", open=pool.open, closed=pool.closed)
        elif cmd == "quit":
            return


# --------------------------------------------------------------------------- orchestrator


class Child:
    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc = proc
        self.name = name

    async def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((line + "\n").encode())
        await self.proc.stdin.drain()

    async def recv(self, event: str, timeout: float = STEP_TIMEOUT_S) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
            if not raw:
                raise RuntimeError(f"{self.name} exited (rc={self.proc.returncode})")
            try:
                msg: dict[str, Any] = json.loads(raw)
            except ValueError:
                continue  # stray output
            if msg.get("event") == event:
                return msg

    async def ask(self, line: str, event: str, timeout: float = STEP_TIMEOUT_S) -> dict[str, Any]:
        await self.send(line)
        return await self.recv(event, timeout)

    def stop(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()


def cpu_split(pin: bool) -> tuple[set[int] | None, set[int] | None]:
    """CPUs for the gateway side and for the clients: apart when there are two or more."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return None, None
    return {cpus[0]}, set(cpus[1:])


async def spawn(name: str, *args: str, cpus: set[int] | None = None) -> Child:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SCRIPT),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        cwd=str(ROOT),
    )
    if cpus:
        os.sched_setaffinity(proc.pid, cpus)
    return Child(proc, name)


async def one_config(
    endpoint: str, loop_name: str, n: int, procs: int, rounds: int, parallel: int, pin: bool
) -> dict[str, Any]:
    gw_cpus, client_cpus = cpu_split(pin)
    children: list[Child] = []
    try:
        gw = await spawn("gateway", "_gateway", endpoint, loop_name, str(n), cpus=gw_cpus)
        children.append(gw)
        ready = await gw.recv("ready")
        port, gw_pid = ready["port"], ready["pid"]
        shares = [n // procs + (1 if k < n % procs else 0) for k in range(procs)]
        firsts = [sum(shares[:k]) for k in range(procs)]
        clients = []
        for k in range(procs):
            c = await spawn(
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
            with contextlib.suppress(Exception):
                if c.proc.stdin is not None:
                    c.proc.stdin.close()
        await asyncio.sleep(0.2)
        for c in children:
            c.stop()
        for c in children:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.proc.wait(), 5)


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
        run(gateway_side(endpoint, int(n)), loop_name)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_clients":
        _, _, port, first, count = sys.argv
        run(client_side(int(port), int(first), int(count)), "uvloop")
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
    args = p.parse_args()
    if args.quick:
        args.clients, args.rounds = 2000, 2
    report = asyncio.run(orchestrate(args))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
