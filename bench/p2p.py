"""P2P push benchmark: REST /v1/push -> push service -> gRPC Deliver -> gateway -> WebSocket.

Starts its own stack as child processes on free loopback ports (the push service and two
gateways in two groups, under a unique Redis key prefix), connects N WebSocket clients in a
separate client process, then sends pushes, each to one random connected uid, through the
REST API on an open-loop schedule. It reports the achieved pushes/s, the end-to-end latency
(from just before the REST call until the client process has the frame) and the REST-call
latency, plus errors and lost frames.

Every child process is stopped by its PID on exit, Ctrl-C and errors.

    .venv/bin/python bench/p2p.py --quick
    .venv/bin/python bench/p2p.py --clients 2000 --rate 1000 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import math
import os
import platform
import random
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any, TypeVar

import httpx
import redis

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection
    from websockets.protocol import Event

from router.devtools.embedded_redis import EmbeddedRedis, redis_answers
from router.devtools.procs import die_with_parent
from shared.keys import KeySchema

HOST = "127.0.0.1"
TOKEN_TTL_S = 3600
CONNECT_PARALLEL = 64  # WebSocket handshakes in flight per client process
READY_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 5.0
OVERALL_TIMEOUT_S = 200.0  # the async part; each run stays well under five minutes
WARMUP_PUSHES = 200
CONNS_PER_CLIENT = 4  # keep-alive connections per httpx.AsyncClient


T = TypeVar("T")


class BenchError(Exception):
    """The benchmark could not run; the message says why."""


# --------------------------------------------------------------------------- machine


def machine_info() -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram = "unknown"
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
                break
    return {
        "nproc": str(len(os.sched_getaffinity(0))),
        "cpu": cpu,
        "ram": ram,
        "kernel": platform.release(),
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
    }


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process, from /proc/<pid>/stat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def raise_nofile(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards `wanted` (at most the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def percentile(sorted_xs: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending sequence; nan when empty."""
    if not sorted_xs:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(sorted_xs)))
    return sorted_xs[min(rank, len(sorted_xs)) - 1]


def loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run_loop(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, on uvloop when it is installed (as the push service runs under uvicorn)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


# --------------------------------------------------------------------------- processes


@dataclass
class Stack:
    """The child processes of one run; stopped together, each by its own PID."""

    env: dict[str, str]
    log_dir: Path
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    _logs: list[IO[bytes]] = field(default_factory=list)

    def spawn(self, name: str, argv: list[str], *, pipes: bool = False) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"{name}.log").open("wb")
        self._logs.append(log)
        proc = subprocess.Popen(
            argv,
            env=self.env,
            stdin=subprocess.PIPE if pipes else subprocess.DEVNULL,
            stdout=subprocess.PIPE if pipes else log,
            stderr=log,
            # Own session: a terminal Ctrl-C reaches only us, and we stop the children.
            start_new_session=True,
            preexec_fn=die_with_parent,  # noqa: PLW1509  (spawned before any thread exists)
        )
        self.procs.append((name, proc))
        return proc

    def pid(self, name: str) -> int:
        return next(p.pid for n, p in self.procs if n == name)

    def check(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise BenchError(f"{name} (pid {proc.pid}) exited with code {proc.returncode}")

    def stop(self) -> None:
        """SIGTERM the children newest first, wait up to 10 s, SIGKILL what is left."""
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for _, proc in reversed(self.procs):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
        self.procs.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()

    def tails(self, lines: int = 15) -> str:
        out = []
        for path in sorted(self.log_dir.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            if text:
                out.append(f"--- {path.name} (last {len(text)} lines)\n" + "\n".join(text))
        return "\n".join(out)


class WorkerLink:
    """JSON lines to and from a client process; a daemon thread reads its stdout."""

    def __init__(self, proc: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self._stdin = proc.stdin
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._backlog: list[dict[str, Any]] = []
        out = proc.stdout

        def pump() -> None:
            for line in out:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                try:
                    loop.call_soon_threadsafe(self._queue.put_nowait, msg)
                except RuntimeError:  # the loop is closed: the run is over
                    return
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._queue.put_nowait, {"event": "eof"})

        threading.Thread(target=pump, name=f"worker-{proc.pid}", daemon=True).start()

    def send(self, **cmd: Any) -> None:
        try:
            self._stdin.write(json.dumps(cmd).encode() + b"\n")
            self._stdin.flush()
        except OSError as exc:
            raise BenchError(f"client process is gone: {exc}") from None

    async def expect(
        self, event: str, timeout: float, match: Callable[[dict[str, Any]], bool] | None = None
    ) -> dict[str, Any]:
        def ok(msg: dict[str, Any]) -> bool:
            return msg.get("event") == event and (match is None or match(msg))

        for i, msg in enumerate(self._backlog):
            if ok(msg):
                return self._backlog.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"client process sent no {event!r} within {timeout:.0f}s")
            try:
                msg = await asyncio.wait_for(self._queue.get(), left)
            except TimeoutError:
                continue
            if msg.get("event") == "eof":
                raise BenchError(f"client process exited while waiting for {event!r}")
            if ok(msg):
                return msg
            self._backlog.append(msg)


# --------------------------------------------------------------------------- client process


def uid_of(k: int) -> str:
    return f"u{k}"


def indices_of(spec: dict[str, Any]) -> range:
    """A client process's client numbers, passed as [start, stop, step] (argv stays short)."""
    start, stop, step = spec["indices"]
    return range(start, stop, step)


class ClientPool:
    """WebSocket clients (the `websockets` asyncio client) in one client process.

    Each client is one task: connect, then wait until the connection ends. Push frames
    are handed to `on_frame(arrival, payload)` as the connection parses them (through
    the client's `create_connection` hook) instead of through `recv()`: that skips one
    task wake-up per frame, which matters when a few client processes share two cores
    with the servers they measure. A client the gateway closes with 1013 (try again
    later, sent when the route registry did not answer) reconnects after a short
    random pause, as a real client would.
    """

    def __init__(
        self,
        indices: Sequence[int],
        url_of: Callable[[int], str],
        on_frame: Callable[[float, bytes], None],
        parallel: int,
    ) -> None:
        self._indices = list(indices)
        self._url_of = url_of
        self._on_frame = on_frame
        self._gate = asyncio.Semaphore(parallel)  # handshakes in flight
        self._pending = len(self._indices)
        self._settled = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.failed: list[int] = []
        self.open = 0
        self.stats = {"try_again": 0, "closed": 0, "connect_errors": 0}
        self._connection_type = _frame_callback_connection(on_frame)

    async def start(self) -> list[int]:
        """Start every client; return when each has connected once or given up."""
        if not self._indices:
            return []
        self._tasks = [asyncio.create_task(self._client(k)) for k in self._indices]
        await self._settled.wait()
        return self.failed

    def _first_outcome(self) -> None:
        self._pending -= 1
        if self._pending == 0:
            self._settled.set()

    async def _client(self, k: int) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import WebSocketException

        url = self._url_of(k)
        first = True
        errors = 0
        while True:
            async with self._gate:
                try:
                    ws = await connect(
                        url,
                        compression=None,
                        ping_interval=None,
                        proxy=None,
                        open_timeout=30,
                        close_timeout=1,
                        max_queue=None,
                        create_connection=self._connection_type,
                    )
                except (OSError, TimeoutError, WebSocketException):
                    ws = None
            if ws is None:
                errors += 1
                self.stats["connect_errors"] += 1
                if errors >= 5:
                    self.failed.append(k)
                    if first:
                        self._first_outcome()
                    return
                await asyncio.sleep(0.2 * errors)
                continue
            self.open += 1
            if first:
                first = False
                self._first_outcome()
            await ws.wait_closed()
            self.open -= 1
            if ws.close_code == 1013:  # CLOSE_TRY_AGAIN
                self.stats["try_again"] += 1
                await asyncio.sleep(0.2 + random.random())
                continue
            self.stats["closed"] += 1
            return

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()


def _frame_callback_connection(
    on_frame: Callable[[float, bytes], None],
) -> type[ClientConnection]:
    """A ClientConnection that passes each whole text frame to `on_frame`."""
    from websockets.asyncio.client import ClientConnection
    from websockets.frames import Frame, Opcode

    monotonic = time.monotonic

    class FrameCallbackConnection(ClientConnection):
        def process_event(self, event: Event) -> None:
            if (
                self.response is not None
                and isinstance(event, Frame)
                and event.opcode is Opcode.TEXT
                and event.fin
            ):
                on_frame(monotonic(), bytes(event.data))
                return
            super().process_event(event)

    return FrameCallbackConnection


async def stdin_commands() -> AsyncIterator[dict[str, Any]]:
    """JSON-line commands from the parent, until it closes our stdin."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        yield json.loads(line)


def emit(**msg: Any) -> None:
    sys.stdout.write(json.dumps(msg, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def token_url(base: str, k: int, secret: str) -> str:
    from shared.auth import issue_token
    from shared.clock import SystemClock

    return f"{base}?token={issue_token(secret, uid_of(k), TOKEN_TTL_S, SystemClock())}"


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

    def on_frame(now: float, data: bytes) -> None:
        try:
            frame = json.loads(data)
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
        indices_of(spec),
        lambda k: token_url(urls[k % len(urls)], k, secret),
        on_frame,
        CONNECT_PARALLEL,
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


async def _push(
    slots: asyncio.Queue[httpx.AsyncClient],
    client: httpx.AsyncClient,
    body: bytes,
    rec: PushRecord,
) -> None:
    try:
        rec.sent = time.monotonic()
        resp = await client.post("/v1/push", content=body)
        rec.answered = time.monotonic()
        rec.status = resp.status_code
        if resp.status_code == 200:
            out = resp.json()
            rec.msg_id = out["msg_id"]
            rec.delivered = bool(out["delivered"])
            rec.failed = bool(out["failed"])
        else:
            rec.error = f"HTTP {resp.status_code}"
    except Exception as exc:  # any failure is a result to count, not a reason to stop
        rec.answered = time.monotonic()
        rec.error = type(exc).__name__
    finally:
        slots.put_nowait(client)


async def _slot_freed(slots: asyncio.Queue[httpx.AsyncClient]) -> None:
    slots.put_nowait(await slots.get())


def make_clients(base_url: str, api_key: str, concurrency: int) -> list[httpx.AsyncClient]:
    """Several small keep-alive pools rather than one big one.

    httpcore's pool scans every connection for every queued request, so one client
    with 64 connections costs the load generator about twice the CPU per request of
    sixteen clients with four connections each (measured on this bench).
    """
    count = math.ceil(concurrency / CONNS_PER_CLIENT)
    per = math.ceil(concurrency / count)
    return [
        httpx.AsyncClient(
            base_url=base_url,
            headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
            limits=httpx.Limits(max_connections=per, max_keepalive_connections=per),
            timeout=httpx.Timeout(10.0),
            trust_env=False,
        )
        for _ in range(count)
    ]


async def run_load(
    clients: list[httpx.AsyncClient],
    bodies: list[bytes],
    rate: float,
    concurrency: int,
    cutoff_s: float,
) -> list[PushRecord]:
    """Open loop: push i is due at t0 + i/rate whatever happened to earlier pushes.

    At most `concurrency` calls are in flight (spread evenly over the clients' pools);
    when that many are outstanding the schedule slips, which the send lag shows. Pushes
    still unsent `cutoff_s` after the start are not sent at all (counted as errors), so
    an overloaded run ends in bounded time.
    """
    slots: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
    for j in range(concurrency):
        slots.put_nowait(clients[j % len(clients)])
    records = [PushRecord() for _ in bodies]
    tasks: set[asyncio.Task[None]] = set()
    t0 = time.monotonic() + 0.05
    stop_at = t0 + cutoff_s
    i = 0
    n = len(bodies)
    while i < n and time.monotonic() < stop_at:
        now = time.monotonic()
        due = t0 + i / rate
        if due > now:
            await asyncio.sleep(due - now)
            continue
        # Everything that is due now goes out now (timers are coarser than 1/rate).
        while i < n and t0 + i / rate <= (now := time.monotonic()) < stop_at:
            if slots.empty():  # `concurrency` calls in flight: wait for one to end
                try:
                    await asyncio.wait_for(_slot_freed(slots), max(0.001, stop_at - now))
                except TimeoutError:
                    break
            client = slots.get_nowait()
            records[i].due = t0 + i / rate
            task = asyncio.create_task(_push(slots, client, bodies[i], records[i]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
    for rec in records[i:]:
        rec.error = "not sent: schedule overrun"
    if tasks:
        await asyncio.wait(tasks, timeout=30)
    for task in tasks:
        task.cancel()
    return records


# --------------------------------------------------------------------------- orchestration


@dataclass
class Options:
    clients: int
    rate: float
    duration: float
    concurrency: int
    seed: int
    json_out: bool


def start_stack(
    stack: Stack, http_port: int, gateways: list[tuple[str, str, int, int]], api_key: str
) -> None:
    py = sys.executable
    stack.spawn(
        "push-service", [py, "-m", "push_service", "--host", HOST, "--port", str(http_port)]
    )
    for gid, group, ws_port, grpc_port in gateways:
        stack.spawn(
            gid,
            [
                py,
                "-m",
                "socket_gateway",
                "--id",
                gid,
                "--group",
                group,
                "--ws-host",
                HOST,
                "--ws-port",
                str(ws_port),
                "--grpc-host",
                HOST,
                "--grpc-port",
                str(grpc_port),
            ],
        )
    request = urllib.request.Request(
        f"http://{HOST}:{http_port}/v1/gateways", headers={"Authorization": f"Bearer {api_key}"}
    )
    wanted = {gid for gid, *_ in gateways}
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        stack.check()
        try:
            with urllib.request.urlopen(request, timeout=1) as resp:
                live = {g["gateway_id"] for g in json.load(resp)["gateways"]}
            if wanted <= live:
                return
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            pass
        time.sleep(0.1)
    raise BenchError(f"the stack was not ready within {READY_TIMEOUT_S:.0f}s")


async def wait_routes(redis_url: str, keys: KeySchema, uids: Sequence[str]) -> None:
    """Until every connected uid has a route: a client's handshake ends before its register."""
    import redis.asyncio as aioredis

    client = aioredis.from_url(redis_url, decode_responses=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            pipe = client.pipeline(transaction=False)
            for uid in uids:
                pipe.exists(keys.route(uid))
            missing = sum(1 for found in await pipe.execute() if not found)
            if not missing:
                return
            if time.monotonic() > deadline:
                raise BenchError(f"{missing} connected uids still have no route after 30s")
            await asyncio.sleep(0.1)
    finally:
        await client.aclose()


def _skip_missing_sniffio() -> None:
    """Make httpcore's per-request `import sniffio` fail fast when sniffio is not installed.

    httpcore 1.0 imports sniffio inside `current_async_library()`, several times per
    request; without sniffio each attempt is a failed import that walks sys.path, which
    cost this load generator about 0.5 ms per request. A None entry in sys.modules makes
    the import fail at once, with the same outcome (httpcore then assumes asyncio).
    """
    if importlib.util.find_spec("sniffio") is None:
        sys.modules["sniffio"] = None  # type: ignore[assignment]


def all_cpu() -> dict[int, float]:
    """CPU seconds of every process on the machine, by PID."""
    out: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (s := cpu_seconds(int(entry))) is not None:
            out[int(entry)] = s
    return out


def others_cpu(before: dict[int, float], after: dict[int, float], mine: set[int]) -> float:
    """CPU seconds that processes not in `mine` used between two `all_cpu()` snapshots.

    Other sessions' work on a shared machine shows up here; a busy neighbour makes
    every figure of the run worse. (Processes that exited in between are missed.)
    """
    return sum(t - before.get(pid, 0.0) for pid, t in after.items() if pid not in mine)


def cpu_snapshot(pids: dict[str, int]) -> tuple[dict[str, float], dict[int, float]]:
    everyone = all_cpu()
    return {name: everyone[pid] for name, pid in pids.items() if pid in everyone}, everyone


async def bench(
    opts: Options,
    stack: Stack,
    worker: subprocess.Popen[bytes],
    http_port: int,
    redis_url: str,
    keys: KeySchema,
    api_key: str,
    cpu_pids: dict[str, int],
) -> dict[str, Any]:
    link = WorkerLink(worker, asyncio.get_running_loop())
    link.send(cmd="go")
    ready = await link.expect("ready", CONNECT_TIMEOUT_S)
    failed = set(ready["failed"])
    connected = [k for k in range(opts.clients) if k not in failed]
    if not connected:
        raise BenchError("no client could connect")
    stack.check()
    await wait_routes(redis_url, keys, [uid_of(k) for k in connected])

    rng = random.Random(opts.seed)
    total = max(1, round(opts.rate * opts.duration))
    targets = [rng.choice(connected) for _ in range(total)]
    bodies = [
        json.dumps({"to": [uid_of(k)], "content": {"seq": i, "text": "bench"}}).encode()
        for i, k in enumerate(targets)
    ]
    warm = [
        json.dumps({"to": [uid_of(rng.choice(connected))], "content": {"seq": -1 - j}}).encode()
        for j in range(WARMUP_PUSHES)
    ]
    _skip_missing_sniffio()
    clients = make_clients(f"http://{HOST}:{http_port}", api_key, opts.concurrency)
    try:
        # Warm-up, not measured: opens the keep-alive and gRPC connections, fills caches.
        await run_load(clients, warm, 1e9, opts.concurrency, cutoff_s=60)
        cpu_before, all_before = cpu_snapshot(cpu_pids)
        wall0 = time.monotonic()
        records = await run_load(
            clients, bodies, opts.rate, opts.concurrency, cutoff_s=2 * opts.duration + 5
        )
        wall1 = time.monotonic()
        cpu_after, all_after = cpu_snapshot(cpu_pids)
        cpu_after["others"] = others_cpu(all_before, all_after, set(cpu_pids.values()))
        cpu_before["others"] = 0.0
    finally:
        for client in clients:
            await client.aclose()

    # Drain: wait for frames still on their way, then fetch every arrival.
    expected = sum(1 for r in records if r.delivered)
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while time.monotonic() < deadline:
        link.send(cmd="count")
        if (await link.expect("count", 10))["n"] >= expected:
            break
        await asyncio.sleep(0.1)
    link.send(cmd="dump")
    dump = await link.expect("dump", 30)
    stack.check()
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

    def pct(xs: list[float]) -> dict[str, float]:
        return {f"p{p}": percentile(xs, p) for p in (50, 90, 99)} | {
            "max": xs[-1] if xs else math.nan
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
        "e2e_ms": pct(e2e),
        "rest_ms": pct(rest),
        "send_lag_ms": pct(lag),
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
    lines = [
        "imroute P2P push benchmark (REST -> push service -> gRPC -> gateway -> WebSocket)",
        "conditions:",
        f"  date        {cond['date']}",
        f"  machine     nproc={cond['nproc']}  cpu={cond['cpu']}  ram={cond['ram']}"
        f"  kernel={cond['kernel']}",
        f"  python      {cond['python']}  client/loadgen loop={cond['loop']}",
        f"  stack       push service (uvicorn, 1 process) + gw1/g1 + gw2/g2; redis {cond['redis']}",
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
        "  cpu         "
        + ", ".join(f"{k} {v:.0f}%" for k, v in r["cpu_pct"].items())
        + "  (% of one core during the load phase; others = processes not started"
        " by this run)",
        "  cpu / push  "
        + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_ms_per_push"].items())
        + "  (ms of CPU per answered push)",
    ]
    print("\n".join(lines), flush=True)


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, default=2000, help="WebSocket clients (default 2000)")
    p.add_argument("--rate", type=float, help="target pushes/s (default 1000; 200 with --quick)")
    p.add_argument("--duration", type=float, default=10, help="load seconds (default 10)")
    p.add_argument("--concurrency", type=int, default=64, help="REST calls in flight (64)")
    p.add_argument("--seed", type=int, default=1, help="random seed for the recipients")
    p.add_argument("--quick", action="store_true", help="smoke run: 200 clients, 3 s, 200/s")
    p.add_argument("--json", action="store_true", help="also print the results as JSON")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.clients, args.duration = 200, 3.0
    if args.rate is None:
        args.rate = 200.0 if args.quick else 1000.0
    if not 1 <= args.clients <= 15000:
        p.error("--clients must be 1-15000")
    if not 1 <= args.rate <= 20000:
        p.error("--rate must be 1-20000")
    if not 0.5 <= args.duration <= 60:
        p.error("--duration must be 0.5-60 seconds")
    if not 1 <= args.concurrency <= 1000:
        p.error("--concurrency must be 1-1000")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(json.loads(args.worker))
    opts = Options(args.clients, args.rate, args.duration, args.concurrency, args.seed, args.json)
    # Children inherit the limit: each gateway holds about half of the clients.
    raise_nofile(opts.clients + 4096)
    return run_main("p2p", lambda h: _p2p(h, opts))


def _p2p(h: Harness, opts: Options) -> None:
    api_key = secrets.token_urlsafe(24)
    h.env["IMROUTE_API_KEY"] = api_key
    http_port = free_port()
    gateways = [
        ("gw1", "g1", free_port(), free_port()),
        ("gw2", "g2", free_port(), free_port()),
    ]
    start_stack(h.stack, http_port, gateways, api_key)
    spec = {
        "urls": [f"ws://{HOST}:{ws}/ws" for _, _, ws, _ in gateways],
        "indices": [0, opts.clients, 1],
    }
    worker = h.stack.spawn(
        "clients",
        [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
        pipes=True,
    )
    cpu_pids = {name: proc.pid for name, proc in h.stack.procs} | {"loadgen": os.getpid()}
    if h.redis_pid:
        cpu_pids["redis"] = h.redis_pid
    result = run_async(
        lambda: bench(opts, h.stack, worker, http_port, h.redis_url, h.keys, api_key, cpu_pids),
        OVERALL_TIMEOUT_S,
    )
    report(result, h.cond)
    if opts.json_out:
        print(json.dumps({"conditions": h.cond, "results": result}))


# --------------------------------------------------------------------------- harness


class Interrupted(Exception):
    """SIGINT (Ctrl-C) or SIGTERM arrived."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


def _set_signals(handler: Callable[[int, FrameType | None], Any] | int) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def run_async(make: Callable[[], Coroutine[Any, Any, T]], timeout_s: float) -> T:
    """Run the async part; SIGINT/SIGTERM cancel it (-> Interrupted), and so does a timeout."""

    async def guarded() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        got: list[int] = []

        def stop(sig: int) -> None:
            got.append(sig)
            task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop, sig)
        try:
            return await asyncio.wait_for(make(), timeout_s)
        except asyncio.CancelledError:
            if got:
                raise Interrupted(signal.Signals(got[0]).name) from None
            raise
        except TimeoutError:
            raise BenchError(f"the run took over {timeout_s:.0f}s") from None
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    try:
        return run_loop(guarded())
    finally:
        _set_signals(_interrupt)


@dataclass
class Harness:
    """What every benchmark run sets up and tears down: Redis, a key prefix, the children."""

    tag: str
    env: dict[str, str]
    stack: Stack
    prefix: str
    redis_url: str = ""
    redis_pid: int | None = None
    embedded: EmbeddedRedis | None = None
    cond: dict[str, str] = field(default_factory=dict)

    @property
    def keys(self) -> KeySchema:
        return KeySchema(self.prefix)


def run_main(tag: str, body: Callable[[Harness], None]) -> int:
    """Run `body` with a harness; stop every child by PID whatever happens."""
    _set_signals(_interrupt)
    log_dir = Path(tempfile.mkdtemp(prefix=f"imroute-bench-{tag}-"))
    env = dict(os.environ)
    h = Harness(tag, env, Stack(env, log_dir), prefix=f"bench:{secrets.token_hex(4)}:")
    h.cond = machine_info() | {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "loop": loop_name(),
    }
    keep_logs = True
    try:
        h.redis_url = os.environ.get("IMROUTE_REDIS_URL", "redis://127.0.0.1:6379/0")
        if redis_answers(h.redis_url):
            h.cond["redis"] = f"{h.redis_url} (external)"
        else:
            h.embedded = EmbeddedRedis()
            h.redis_url = h.embedded.start()
            h.cond["redis"] = f"embedded redis-server at {h.redis_url}"
        h.redis_pid = _local_redis_pid(h.redis_url, h.embedded)
        env.update(
            IMROUTE_REDIS_URL=h.redis_url,
            IMROUTE_REDIS_PREFIX=h.prefix,
            IMROUTE_SECRET=secrets.token_urlsafe(32),
            IMROUTE_LOG_LEVEL="warning",
        )
        body(h)
        keep_logs = False
        return 0
    except Interrupted as exc:
        print(f"{tag} bench: interrupted by {exc}; stopping the children", file=sys.stderr)
        keep_logs = False
        return 130
    except BenchError as exc:
        print(f"{tag} bench: {exc}", file=sys.stderr)
        print(h.stack.tails(), file=sys.stderr)
        return 1
    finally:
        _set_signals(signal.SIG_IGN)  # the clean-up below is bounded: let it finish
        h.stack.stop()
        if h.redis_url:
            _drop_prefix(h.redis_url, h.prefix)
        if h.embedded is not None:
            h.embedded.stop()
        if keep_logs:
            print(f"{tag} bench: the children's logs are in {log_dir}", file=sys.stderr)
        else:
            shutil.rmtree(log_dir, ignore_errors=True)
        _set_signals(signal.SIG_DFL)


def _local_redis_pid(url: str, embedded: EmbeddedRedis | None) -> int | None:
    """The redis-server's PID when it runs on this machine, for CPU accounting."""
    if embedded is not None:
        return embedded.pid
    with contextlib.suppress(redis.RedisError, OSError, KeyError, ValueError):
        client = redis.Redis.from_url(url, socket_timeout=1)
        try:
            pid = int(client.info("server")["process_id"])
        finally:
            client.close()
        if Path(f"/proc/{pid}/comm").read_text().strip().startswith("redis"):
            return pid
    return None


def _drop_prefix(url: str, prefix: str) -> None:
    """Delete what this run left under its own key prefix."""
    with contextlib.suppress(redis.RedisError, OSError, ValueError):
        client = redis.Redis.from_url(url, socket_timeout=2)
        try:
            keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
            for i in range(0, len(keys), 1000):
                client.delete(*keys[i : i + 1000])
        finally:
            client.close()


if __name__ == "__main__":
    sys.exit(main())
