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

    .venv/bin/python bench/slow_gateway.py --quick      # ~45 s
    .venv/bin/python bench/slow_gateway.py              # ~2 min
    .venv/bin/python bench/slow_gateway.py --long-deadline 0.3 --json
    .venv/bin/python bench/slow_gateway.py --phases without,with,without
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import redis

if TYPE_CHECKING:
    import redis.asyncio as aioredis
    from websockets.asyncio.client import ClientConnection
    from websockets.protocol import Event

sys.path.insert(0, str(Path(__file__).resolve().parent))
from p2p import (
    HOST,
    BenchError,
    Harness,
    _skip_missing_sniffio,
    cpu_snapshot,
    emit,
    free_port,
    make_clients,
    others_cpu,
    percentile,
    raise_nofile,
    run_async,
    run_loop,
    run_main,
    stdin_commands,
    token_url,
    uid_of,
)

from router.routes.codec import decode_route
from shared.keys import KeySchema

GATEWAYS = ("gw1", "gw2", "gw3", "gw4")
SLOW_GATEWAY = "gw4"
GROUP = "g1"
READY_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 120.0
CONNECT_PARALLEL = 64
WARMUP_PUSHES = 200  # to healthy users only: a warm-up must not move the slow gateway's circuit
LATE_WAIT_S = 1.0  # after the last answer, for frames of pushes reported failed that come late
DRAIN_TIMEOUT_S = 5.0
PRODUCT_DIRS = ("push_service", "router", "shared", "socket_gateway")
REDIS_SAMPLE_S = 2.0  # the MONITOR window in the middle of each phase (segment)
PHASE_STRIDE = 10_000_000  # phase p's pushes carry seq p*PHASE_STRIDE + i
METRIC_NAMES = (
    "imroute_gateway_call_attempts_total",
    "imroute_gateway_call_retries_total",
    "imroute_gateway_calls_failed_total",
)


# --------------------------------------------------------------------------- phases


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    retries: int
    circuit_failures: int
    cool_off_s: float
    deadline_s: float
    slow: bool = True  # False: gw4 answers at once too (the baseline)

    def env(self) -> dict[str, str]:
        return {
            "IMROUTE_DELIVER_RETRIES": str(self.retries),
            "IMROUTE_CIRCUIT_FAILURES": str(self.circuit_failures),
            "IMROUTE_CIRCUIT_COOL_OFF_S": f"{self.cool_off_s:g}",
            "IMROUTE_DELIVER_TIMEOUT_S": f"{self.deadline_s:g}",
        }


@dataclass(frozen=True, slots=True)
class Options:
    clients: int
    rate: float
    duration: float
    deadline_s: float
    slow_s: float
    long_deadline_s: float
    order: tuple[str, ...]
    concurrency: int
    seed: int
    json_out: bool

    def phases(self) -> list[Phase]:
        known = {
            "baseline": Phase("baseline", 1, 5, 10.0, self.deadline_s, slow=False),
            "without": Phase("without", 0, 0, 10.0, self.deadline_s),
            "with": Phase("with", 1, 5, 10.0, self.deadline_s),
            "long": Phase("with, long deadline", 1, 5, 10.0, self.long_deadline_s),
        }
        return [known[name] for name in self.order]


# --------------------------------------------------------------------------- child: gateways


def gateways_main(spec: dict[str, Any]) -> int:
    """The gateways process: gw1..gw4 in one event loop; 'stats' answers their counters."""
    run_loop(_gateways(spec))
    return 0


async def _gateways(spec: dict[str, Any]) -> None:
    from shared.settings import Settings
    from socket_gateway.app import Gateway
    from socket_gateway.faults import DelayCalls

    async with AsyncExitStack() as stack:
        gateways: dict[str, Gateway] = {}
        delays: dict[str, DelayCalls] = {}
        for gid, ws_port, grpc_port, delay_s in spec["gateways"]:
            settings = Settings.load(
                os.environ,
                gateway_id=gid,
                group_id=GROUP,
                ws_host=HOST,
                ws_port=ws_port,
                grpc_host=HOST,
                grpc_port=grpc_port,
            )
            interceptors = []
            if delay_s > 0:
                interceptors.append(delays.setdefault(gid, DelayCalls(delay_s)))
            gateways[gid] = await stack.enter_async_context(Gateway(settings, None, interceptors))
        emit(event="ready", ws_ports={gid: gw.ws_port for gid, gw in gateways.items()})
        async for cmd in stdin_commands():
            if cmd["cmd"] == "delay":  # the same interceptor, its delay switched off or on
                for delay in delays.values():
                    delay.seconds = float(cmd["seconds"])
                emit(event="delay", seconds=cmd["seconds"])
            elif cmd["cmd"] == "stats":
                emit(
                    event="stats",
                    gateways={
                        gid: {
                            "calls": gw.deliver_service.calls,
                            "batches": gw.deliver_service.batches,
                            "connections": len(gw.conns),
                        }
                        for gid, gw in gateways.items()
                    },
                )


# --------------------------------------------------------------------------- child: clients


@dataclass
class Tally:
    """What the clients received since the last dump."""

    by_seq: dict[int, int] = field(default_factory=dict)
    by_uid: dict[str, int] = field(default_factory=dict)
    bad: int = 0
    warmup: int = 0


def clients_main(spec: dict[str, Any]) -> int:
    """The client process: connects on 'go'; counts push frames per seq and per uid."""
    raise_nofile(spec["clients"] + 1024)
    run_loop(_clients(spec))
    return 0


async def _clients(spec: dict[str, Any]) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import WebSocketException

    urls: list[str] = spec["urls"]
    secret = os.environ["IMROUTE_SECRET"]
    tally = Tally()
    owner: dict[ClientConnection, str] = {}  # which uid each open connection is
    state = {"open": 0, "try_again": 0, "closed": 0}

    def on_frame(conn: ClientConnection, data: bytes) -> None:
        try:
            seq = int(json.loads(data)["content"]["seq"])
        except (ValueError, KeyError, TypeError):
            tally.bad += 1
            return
        if seq < 0:
            tally.warmup += 1
            return
        tally.by_seq[seq] = tally.by_seq.get(seq, 0) + 1
        uid = owner.get(conn, "?")
        tally.by_uid[uid] = tally.by_uid.get(uid, 0) + 1

    conn_type = _frame_connection(on_frame)
    gate = asyncio.Semaphore(CONNECT_PARALLEL)
    failed: list[int] = []
    pending = spec["clients"]
    settled = asyncio.Event()

    def first_outcome() -> None:
        nonlocal pending
        pending -= 1
        if pending == 0:
            settled.set()

    async def client(k: int) -> None:
        url = token_url(urls[k % len(urls)], k, secret)
        first, errors = True, 0
        while True:
            async with gate:
                try:
                    ws = await connect(
                        url,
                        compression=None,
                        ping_interval=None,
                        proxy=None,
                        open_timeout=30,
                        close_timeout=1,
                        max_queue=None,
                        create_connection=conn_type,
                    )
                except (OSError, TimeoutError, WebSocketException):
                    ws = None
            if ws is None:
                errors += 1
                if errors >= 5:
                    failed.append(k)
                    if first:
                        first_outcome()
                    return
                await asyncio.sleep(0.2 * errors)
                continue
            owner[ws] = uid_of(k)
            state["open"] += 1
            if first:
                first = False
                first_outcome()
            await ws.wait_closed()
            state["open"] -= 1
            del owner[ws]
            if ws.close_code == 1013:  # try again later: reconnect, as a real client would
                state["try_again"] += 1
                await asyncio.sleep(0.2 + random.random())
                continue
            state["closed"] += 1
            return

    tasks: list[asyncio.Task[None]] = []
    async for cmd in stdin_commands():
        if cmd["cmd"] == "go":
            started = time.monotonic()
            tasks = [asyncio.create_task(client(k)) for k in range(spec["clients"])]
            await settled.wait()
            emit(event="ready", failed=failed, seconds=time.monotonic() - started)
        elif cmd["cmd"] == "count":
            emit(event="count", n=sum(tally.by_seq.values()))
        elif cmd["cmd"] == "dump":
            seqs = list(tally.by_seq)
            emit(
                event="dump",
                seqs=seqs,
                counts=[tally.by_seq[s] for s in seqs],
                by_uid=tally.by_uid,
                bad=tally.bad,
                warmup=tally.warmup,
                **state,
            )
            tally = Tally()
    for task in tasks:
        task.cancel()
    # Leave without closing handshakes: the OS closes the sockets when the process exits.
    os._exit(0)


def _frame_connection(
    on_frame: Callable[[ClientConnection, bytes], None],
) -> type[ClientConnection]:
    """A ClientConnection that hands each whole text frame, and itself, to `on_frame`."""
    from websockets.asyncio.client import ClientConnection
    from websockets.frames import Frame, Opcode

    class FrameCallbackConnection(ClientConnection):
        def process_event(self, event: Event) -> None:
            if (
                self.response is not None
                and isinstance(event, Frame)
                and event.opcode is Opcode.TEXT
                and event.fin
            ):
                on_frame(self, bytes(event.data))
                return
            super().process_event(event)

    return FrameCallbackConnection


# --------------------------------------------------------------------------- parent side


class Link:
    """JSON lines to and from a child process, read on the event loop (no reader thread,
    so that later children can still be forked safely)."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.name = name
        self._proc = proc
        self._reader: asyncio.StreamReader | None = None
        self._transport: asyncio.BaseTransport | None = None
        self._backlog: list[dict[str, Any]] = []

    async def open(self) -> None:
        assert self._proc.stdout is not None
        reader = asyncio.StreamReader(limit=1 << 27)  # a dump is one long line
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), self._proc.stdout
        )
        self._reader = reader

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def send(self, **cmd: Any) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(cmd).encode() + b"\n")
            self._proc.stdin.flush()
        except OSError as exc:
            raise BenchError(f"the {self.name} process is gone: {exc}") from None

    async def expect(self, event: str, timeout: float) -> dict[str, Any]:
        for i, msg in enumerate(self._backlog):
            if msg.get("event") == event:
                return self._backlog.pop(i)
        assert self._reader is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"the {self.name} process sent no {event!r} in {timeout:.0f}s")
            try:
                line = await asyncio.wait_for(self._reader.readline(), left)
            except TimeoutError:
                continue
            if not line:
                raise BenchError(f"the {self.name} process exited while we waited for {event!r}")
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("event") == event:
                return dict(msg)
            self._backlog.append(msg)


@dataclass(slots=True)
class Push:
    seq: int
    uid: str
    slow: bool
    due: float = math.nan
    sent: float = math.nan
    answered: float = math.nan
    outcome: str = ""  # delivered | failed | offline | error | not sent
    reason: str = ""  # why it failed, as the answer's `errors` said


def failure_kind(error: str) -> str:
    """A short name for a gateway error the push answer carried."""
    if error.startswith("circuit open"):
        return "circuit open"
    if error.startswith("DEADLINE_EXCEEDED: queued"):
        return "deadline (queued in the push service)"
    if error.startswith("DEADLINE_EXCEEDED"):
        return "deadline"
    return error[:60]


async def _push(
    slots: asyncio.Queue[httpx.AsyncClient], client: httpx.AsyncClient, body: bytes, p: Push
) -> None:
    try:
        p.sent = time.monotonic()
        resp = await client.post("/v1/push", content=body)
        p.answered = time.monotonic()
        if resp.status_code != 200:
            p.outcome, p.reason = "error", f"HTTP {resp.status_code}"
            return
        out = resp.json()
        if out["delivered"]:
            p.outcome = "delivered"
        elif out["failed"]:
            p.outcome = "failed"
            p.reason = "; ".join(failure_kind(e["error"]) for e in out["errors"]) or "?"
        else:
            p.outcome = "offline"
    except Exception as exc:  # any failure is a result to count, not a reason to stop
        p.answered = time.monotonic()
        p.outcome, p.reason = "error", type(exc).__name__
    finally:
        slots.put_nowait(client)


async def run_load(
    clients: list[httpx.AsyncClient],
    pushes: list[Push],
    bodies: list[bytes],
    rate: float,
    concurrency: int,
    cutoff_s: float,
) -> None:
    """Open loop: push i is due at t0 + i/rate, whatever happened to the earlier ones.

    Each of the `concurrency` slots is one keep-alive connection of one client's pool, so
    a call never queues inside httpx; when every slot is busy the schedule slips (the send
    lag shows it). Pushes still unsent `cutoff_s` after the start are not sent.
    """
    slots: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
    for j in range(concurrency):
        slots.put_nowait(clients[j % len(clients)])
    tasks: set[asyncio.Task[None]] = set()
    t0 = time.monotonic() + 0.05
    stop_at = t0 + cutoff_s
    for i, (p, body) in enumerate(zip(pushes, bodies, strict=True)):
        p.due = t0 + i / rate
        if (wait := p.due - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        if time.monotonic() >= stop_at:
            break
        try:
            client = await asyncio.wait_for(slots.get(), max(0.001, stop_at - time.monotonic()))
        except TimeoutError:
            break
        task = asyncio.create_task(_push(slots, client, body, p))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=30)
    for task in tasks:
        task.cancel()
    for p in pushes:
        p.outcome = p.outcome or ("not sent" if math.isnan(p.sent) else "no answer")


def imroute_cli() -> list[str]:
    """The `imroute` console script next to this interpreter (the venv's)."""
    script = Path(sys.executable).with_name("imroute")
    if not script.exists():
        raise BenchError(f"no imroute command at {script}: is the package installed?")
    return [str(script)]


async def wait_push_service(
    http: httpx.AsyncClient, api_key: str, is_up: Callable[[], None]
) -> None:
    """Until the push service answers and lists every gateway as live."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        is_up()
        try:
            resp = await http.get(
                "/v1/gateways", headers={"Authorization": f"Bearer {api_key}"}, timeout=1
            )
            live = {g["gateway_id"] for g in resp.json()["gateways"]}
            if set(GATEWAYS) <= live:
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        await asyncio.sleep(0.1)
    raise BenchError(f"the push service was not ready within {READY_TIMEOUT_S:.0f}s")


async def scrape_metrics(http: httpx.AsyncClient) -> dict[str, float]:
    """The per-gateway call counters from the push service's /metrics."""
    try:
        text = (await http.get("/metrics", timeout=5)).text
    except httpx.HTTPError as exc:
        raise BenchError(f"could not read the push service's /metrics: {exc}") from None
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(METRIC_NAMES):
            m = re.fullmatch(r"(\w+)\{(.*)\} (\S+)", line)
            if m:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', m[2]))
                name = m[1].removeprefix("imroute_gateway_").removesuffix("_total")
                out[f"{name}[{','.join(labels.values())}]"] = float(m[3])
    return out


async def routes_by_uid(redis_url: str, keys: KeySchema, uids: Sequence[str]) -> dict[str, str]:
    """uid -> its gateway, from Redis, once every uid has a route (30 s at most)."""
    import redis.asyncio as aioredis

    client = aioredis.from_url(redis_url, decode_responses=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            pipe = client.pipeline(transaction=False)
            for uid in uids:
                pipe.hgetall(keys.route(uid))
            where: dict[str, str] = {}
            for uid, fields in zip(uids, await pipe.execute(), strict=True):
                routes = [decode_route(uid, c, v) for c, v in fields.items()]
                gateways = {r.gateway_id for r in routes if r is not None}
                if len(gateways) == 1:
                    where[uid] = gateways.pop()
            if len(where) == len(uids):
                return where
            if time.monotonic() > deadline:
                raise BenchError(f"{len(uids) - len(where)} uids have no single route after 30s")
            await asyncio.sleep(0.1)
    finally:
        await client.aclose()


def code_version() -> str:
    """Which product code the children import: its folder, and its commit when it is a
    git checkout (other sessions may commit while a run goes on: measure a snapshot)."""
    import router

    root = Path(router.__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", *PRODUCT_DIRS],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"{root} (not a git checkout)"
    return f"{root} at {head}" + (" with uncommitted changes" if dirty else "")


def redis_version(url: str) -> str:
    with contextlib.suppress(redis.RedisError, OSError, KeyError, ValueError):
        client = redis.Redis.from_url(url, socket_timeout=2)
        try:
            return str(client.info("server")["redis_version"])
        finally:
            client.close()
    return "unknown"


# --------------------------------------------------------------------------- orchestration


@dataclass
class Run:
    h: Harness
    opts: Options
    api_key: str
    gateways: Link
    clients: Link
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
        where = await routes_by_uid(h.redis_url, h.keys, uids)
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


@dataclass
class Totals:
    """What the segments of one phase add up to."""

    metrics: dict[str, float] = field(default_factory=dict)
    batches: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    span_s: float = 0.0  # first send to last answer, summed over the segments
    redis: list[dict[str, float]] = field(default_factory=list)  # per segment, per second

    def add(self, into: dict[str, Any], values: dict[str, Any]) -> None:
        for k, v in values.items():
            into[k] = into.get(k, 0) + v


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
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while time.monotonic() < deadline:
        run.clients.send(cmd="count")
        if (await run.clients.expect("count", 10))["n"] >= expected:
            break
        await asyncio.sleep(0.1)
    run.clients.send(cmd="dump")
    dump = await run.clients.expect("dump", 30)
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
            _skip_missing_sniffio()
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
        stop_child(h, name)
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


async def sample_redis(url: str, prefix: str, after_s: float) -> dict[str, float]:
    """This run's Redis commands during a short window, by kind, counted with MONITOR.

    INFO commandstats counts the whole server, which other sessions' tests share; MONITOR
    shows each command's keys, so only this run's prefix is counted. It costs Redis some
    work while it runs, hence a short window.
    """
    import redis.asyncio as aioredis

    await asyncio.sleep(after_s)
    counts = {"fleet reads": 0, "route look-ups": 0, "all": 0}
    client = aioredis.from_url(url, decode_responses=True)
    try:
        await _count_commands(client, prefix, counts)
    except (redis.RedisError, OSError):
        return {}  # the figure is left out; the run itself is still good
    finally:
        await client.aclose()
    return {k: v / REDIS_SAMPLE_S for k, v in counts.items()}


async def _count_commands(client: aioredis.Redis, prefix: str, counts: dict[str, int]) -> None:
    fleet_key = KeySchema(prefix).gateways()
    async with client.monitor() as monitor:
        end = time.monotonic() + REDIS_SAMPLE_S
        while (left := end - time.monotonic()) > 0:
            try:
                info = await asyncio.wait_for(monitor.next_command(), left)
            except TimeoutError:
                break
            command = info["command"]
            if prefix not in command:
                continue
            counts["all"] += 1
            if info["client_type"] == "lua":
                continue  # inside a script, e.g. the gateways' route refresh every 20 s
            verb = command.split(" ", 1)[0].upper()
            if verb == "ZRANGEBYSCORE" and fleet_key in command:
                counts["fleet reads"] += 1
            elif verb == "HGETALL":
                counts["route look-ups"] += 1


def steal_seconds() -> float:
    """CPU time the hypervisor took from this VM so far, all CPUs (/proc/stat)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    return 0.0


def bodies_of(pushes: list[Push]) -> list[bytes]:
    return [
        json.dumps({"to": [p.uid], "content": {"seq": p.seq, "text": "bench"}}).encode()
        for p in pushes
    ]


def stop_child(h: Harness, name: str) -> None:
    """SIGTERM one child by its PID, SIGKILL it after 10 s; forget it."""
    for entry in list(h.stack.procs):
        if entry[0] != name:
            continue
        proc = entry[1]
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        h.stack.procs.remove(entry)


# --------------------------------------------------------------------------- figures


def pct(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {f"p{p}": percentile(xs, p) for p in (50, 90, 99)} | {
        "max": xs[-1] if xs else math.nan,
        "n": float(len(xs)),
    }


def summarize(
    phase: Phase,
    opts: Options,
    pushes: list[Push],
    dump: dict[str, Any],
    totals: Totals,
    segments: int,
) -> dict[str, Any]:
    sent = [p for p in pushes if not math.isnan(p.sent)]
    answered = [p for p in sent if not math.isnan(p.answered)]
    t0 = min((p.sent for p in sent), default=math.nan)

    def latency(ps: list[Push]) -> dict[str, float]:
        return pct([(p.answered - p.sent) * 1000 for p in ps if not math.isnan(p.answered)])

    def outcomes(ps: list[Push]) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in ps:
            out[p.outcome or "?"] = out.get(p.outcome or "?", 0) + 1
        return out

    def reasons(ps: list[Push]) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in ps:
            if p.reason:
                out[p.reason] = out.get(p.reason, 0) + 1
        return out

    slow = [p for p in sent if p.slow]
    healthy = [p for p in sent if not p.slow]

    # The clients' view: each push reported delivered must have arrived exactly once.
    got = dict(zip(dump["seqs"], dump["counts"], strict=True))
    ours = {p.seq: p for p in pushes}
    lost = duplicates = late_failed = 0
    expected_by_uid: dict[str, int] = {}
    for p in pushes:
        n = got.get(p.seq, 0)
        if p.outcome == "delivered":
            expected_by_uid[p.uid] = expected_by_uid.get(p.uid, 0) + 1
            lost += int(n == 0)
            duplicates += max(0, n - 1)
        elif n:
            late_failed += n
    stray = sum(n for s, n in got.items() if s not in ours)
    by_uid: dict[str, int] = dump["by_uid"]
    uid_mismatch = sum(
        1
        for u in set(expected_by_uid) | set(by_uid)
        if expected_by_uid.get(u, 0) != by_uid.get(u, 0)
    )

    return {
        "phase": phase.name,
        "settings": phase.env(),
        "scheduled": len(pushes),
        "sent": len(sent),
        "achieved_rate": len(answered) / totals.span_s if totals.span_s > 0 else math.nan,
        "send_lag_ms": pct([(p.sent - p.due) * 1000 for p in sent]),
        "latency_ms": {"all": latency(sent), "healthy": latency(healthy), "slow": latency(slow)},
        "outcomes": {"healthy": outcomes(healthy), "slow": outcomes(slow)},
        "failure_reasons": {"healthy": reasons(healthy), "slow": reasons(slow)},
        "circuit": circuit_timeline(slow, t0),
        "segments": segments,
        "metrics": totals.metrics,
        "gateway_batches": totals.batches,
        "gateway_calls": totals.calls,
        "frames": {
            "lost": lost,
            "duplicates": duplicates,
            "arrived_though_not_delivered": late_failed,
            "stray": stray,
            "uids_with_wrong_count": uid_mismatch,
            "bad": dump["bad"],
            "unknown_connection": by_uid.get("?", 0),
        },
        "clients_open": dump["open"],
        "clients_try_again": dump["try_again"],
        "cpu_pct": {n: 100 * v / totals.wall_s for n, v in totals.cpu_s.items()},
        "redis_per_s": {
            k: sum(r[k] for r in totals.redis if k in r) / len(totals.redis)
            for k in dict.fromkeys(k for r in totals.redis for k in r)
        },
        "per_second": per_second(sent, t0),
        "duration_s": opts.duration,
        "rate": opts.rate,
    }


def per_second(sent: list[Push], t0: float) -> list[dict[str, Any]]:
    """Per second of the phase: pushes, p99 per class, refusals and healthy failures."""
    buckets: dict[int, list[Push]] = {}
    for p in sent:
        buckets.setdefault(int(p.sent - t0), []).append(p)
    out = []
    for second, ps in sorted(buckets.items()):
        lat = {
            cls: percentile(sorted((p.answered - p.sent) * 1000 for p in ps if p.slow is slow), 99)
            for cls, slow in (("healthy", False), ("slow", True))
        }
        out.append(
            {
                "t": second,
                "n": len(ps),
                "healthy_p99_ms": round(lat["healthy"], 1),
                "slow_p99_ms": round(lat["slow"], 1),
                "refused": sum(1 for p in ps if p.reason == "circuit open"),
                "healthy_failed": sum(1 for p in ps if not p.slow and p.outcome != "delivered"),
            }
        )
    return out


def circuit_timeline(slow: list[Push], t0: float) -> dict[str, Any]:
    """When the circuit refused the slow gateway's pushes, and what got through between.

    A run of "circuit open" answers is one open period; the pushes to the slow gateway
    answered otherwise between two runs are what the half-open state let through (the
    probe), plus calls that were in flight when it opened.
    """
    ordered = sorted(slow, key=lambda p: p.sent)
    refused = [p for p in ordered if p.reason == "circuit open"]
    gaps: list[dict[str, Any]] = []
    seen_refusal = False
    gap: list[Push] = []
    for p in ordered:
        if p.reason == "circuit open":
            if seen_refusal and gap:
                gaps.append(
                    {
                        "at_s": round(gap[0].sent - t0, 2),
                        "pushes": len(gap),
                        "outcomes": sorted({q.reason or q.outcome for q in gap}),
                    }
                )
            seen_refusal, gap = True, []
        elif seen_refusal:
            gap.append(p)
    before_open = next((i for i, p in enumerate(ordered) if p.reason == "circuit open"), None)
    return {
        "refused": len(refused),
        "first_refusal_s": round(refused[0].sent - t0, 3) if refused else None,
        "attempts_before_first_refusal": before_open,
        "let_through_while_open": gaps,
        "after_last_refusal": len(gap) if seen_refusal else None,
    }


def fmt_lat(d: dict[str, float]) -> str:
    if not d["n"]:
        return "n=0"
    return f"{d['p50']:7.1f} {d['p90']:7.1f} {d['p99']:7.1f} {d['max']:7.1f} ms   (n={d['n']:.0f})"


def fmt_gaps(circ: dict[str, Any]) -> str:
    """The pushes the open circuit let through (half-open probes), one item per gap."""
    if circ["first_refusal_s"] is None:
        return "- (the circuit never refused a push)"
    items = [
        f"t={g['at_s']:.1f}s {g['pushes']} ({', '.join(g['outcomes'])})"
        for g in circ["let_through_while_open"]
    ]
    tail = circ["after_last_refusal"]
    return ("; ".join(items) or "none") + f"; {tail} pushes after the last refusal"


def report(result: dict[str, Any], cond: dict[str, str], opts: Options) -> None:
    setup = result["setup"]
    lines = [
        f"imroute P2P with one slow gateway ({SLOW_GATEWAY} answers {opts.slow_s * 1000:.0f} ms"
        " late): circuit breaker and retries, with and without",
        "conditions:",
        f"  date        {cond['date']}",
        f"  machine     nproc={cond['nproc']}  cpu={cond['cpu']}  ram={cond['ram']}"
        f"  kernel={cond['kernel']}",
        f"  python      {cond['python']}  loadgen/clients/gateways loop={cond['loop']}",
        f"  code        {cond['code']}",
        f"  redis       {cond['redis']}, version {cond['redis_version']}",
        f"  phases      {', '.join(p.name for p in opts.phases())}; P2P deadline"
        f" {opts.deadline_s:g} s; {SLOW_GATEWAY} delayed {opts.slow_s * 1000:g} ms except in"
        " the baseline",
        f"  stack       imroute push-service (uvicorn, 1 process, fresh per phase or segment); "
        f"{', '.join(GATEWAYS)} in one process; clients in another",
        f"  clients     {setup['clients']} connected ({setup['clients_failed']} failed) in"
        f" {setup['connect_s']:.1f}s; per gateway {setup['per_gateway']}",
        f"  load        {opts.rate:g} pushes/s for {opts.duration:g}s per phase, open loop,"
        f" concurrency {opts.concurrency}, 1 random uid per push; {WARMUP_PUSHES} warm-up"
        " pushes to healthy users first",
    ]
    for r in result["phases"]:
        lat, out, fr, circ = r["latency_ms"], r["outcomes"], r["frames"], r["circuit"]
        retries = sum(v for k, v in r["metrics"].items() if k.startswith("call_retries"))
        lines += [
            f"phase: {r['phase']}   ({' '.join(f'{k}={v}' for k, v in r['settings'].items())})"
            + (
                f"; {r['segments']} segments, each with a fresh push service"
                if r["segments"] > 1
                else ""
            ),
            f"  pushes      {r['scheduled']} scheduled, {r['sent']} sent,"
            f" achieved {r['achieved_rate']:.0f}/s; send lag p99 {r['send_lag_ms']['p99']:.1f} ms",
            "  REST ms     p50     p90     p99     max",
            f"  all       {fmt_lat(lat['all'])}",
            f"  healthy   {fmt_lat(lat['healthy'])}",
            f"  slow      {fmt_lat(lat['slow'])}",
            f"  answers     healthy {out['healthy']}; slow {out['slow']}",
            f"  failed by   healthy {r['failure_reasons']['healthy'] or '-'};"
            f" slow {r['failure_reasons']['slow'] or '-'}",
            f"  circuit     {circ['refused']} pushes refused (circuit open); first refusal at"
            f" {circ['first_refusal_s']} s, after {circ['attempts_before_first_refusal']}"
            " pushes to the slow gateway",
            "  let through " + fmt_gaps(circ),
            "  /metrics    "
            + ", ".join(f"{k} {v:g}" for k, v in sorted(r["metrics"].items()) if v)
            + f"; retries in all: {retries:g}",
            f"  gateways    batches handled {r['gateway_batches']};"
            f" gRPC calls {r['gateway_calls']}",
            f"  frames      lost {fr['lost']}, duplicates {fr['duplicates']}, arrived though not"
            f" reported delivered {fr['arrived_though_not_delivered']}, stray {fr['stray']},"
            f" uids with wrong count {fr['uids_with_wrong_count']}, bad {fr['bad']}",
            f"  clients     {r['clients_open']} open at the end, {r['clients_try_again']}"
            " reconnects after 1013",
            "  redis       "
            + ", ".join(f"{k} {v:.0f}/s" for k, v in r["redis_per_s"].items())
            + f" (this run's commands, MONITOR over {REDIS_SAMPLE_S:g} s mid-phase)",
            "  cpu         "
            + ", ".join(f"{k} {v:.0f}%" for k, v in r["cpu_pct"].items())
            + " (% of one core; others = processes not started by this run)",
        ]
    lines += ["summary (REST latency, ms):", summary_table(result["phases"])]
    print("\n".join(lines), flush=True)


def summary_table(phases: list[dict[str, Any]]) -> str:
    head = (
        "| phase | all p50 / p99 | healthy p50 / p99 | slow p50 / p99 / max"
        " | slow delivered / failed | circuit refusals |"
    )
    rows = [head, "|---|---|---|---|---|---|"]
    for r in phases:
        lat = r["latency_ms"]
        slow_out = r["outcomes"]["slow"]
        rows.append(
            f"| {r['phase']} | {lat['all']['p50']:.1f} / {lat['all']['p99']:.1f}"
            f" | {lat['healthy']['p50']:.1f} / {lat['healthy']['p99']:.1f}"
            f" | {lat['slow']['p50']:.1f} / {lat['slow']['p99']:.1f} / {lat['slow']['max']:.1f}"
            f" | {slow_out.get('delivered', 0)} / {slow_out.get('failed', 0)}"
            f" | {r['circuit']['refused']} |"
        )
    return "\n".join(rows)


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, help="WebSocket clients (default 400; 100 with --quick)")
    p.add_argument("--rate", type=float, help="pushes/s (default 200; 150 with --quick)")
    p.add_argument("--duration", type=float, help="seconds per phase (default 30; 8 with --quick)")
    p.add_argument(
        "--deadline", type=float, default=0.1, help="IMROUTE_DELIVER_TIMEOUT_S (default 0.1)"
    )
    p.add_argument("--slow-ms", type=float, default=200, help="gw4's added delay (default 200)")
    p.add_argument(
        "--long-deadline",
        type=float,
        help="add the phase 'long': the circuit as in 'with', and this deadline in s\n"
        "(above the delay; default 0.3 when 'long' is named in --phases)",
    )
    p.add_argument(
        "--phases",
        help="which phases, in order, from baseline, without, with, long\n"
        "(default: baseline,without,with; and long with --long-deadline)",
    )
    p.add_argument("--concurrency", type=int, default=128, help="REST calls in flight (128)")
    p.add_argument("--seed", type=int, default=1, help="random seed for the recipients")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: 100 clients, 150/s, 8 s per phase"
    )
    p.add_argument("--json", action="store_true", help="also print the results as JSON")
    p.add_argument("--serve-gateways", help=argparse.SUPPRESS)
    p.add_argument("--serve-clients", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.clients = args.clients or (100 if args.quick else 400)
    args.rate = args.rate or (150.0 if args.quick else 200.0)
    args.duration = args.duration or (8.0 if args.quick else 30.0)
    if not 4 <= args.clients <= 10000:
        p.error("--clients must be 4-10000")
    if not 1 <= args.rate <= 5000:
        p.error("--rate must be 1-5000")
    if not 1 <= args.duration <= 120:
        p.error("--duration must be 1-120 seconds")
    if not 0.001 <= args.deadline <= 60:
        p.error("--deadline must be 0.001-60 seconds")
    if args.long_deadline is not None and not 0.001 <= args.long_deadline <= 60:
        p.error("--long-deadline must be 0.001-60 seconds")
    if args.phases is None:
        args.phases = "baseline,without,with" + (",long" if args.long_deadline else "")
    args.phases = tuple(x.strip() for x in args.phases.split(",") if x.strip())
    if not args.phases or not set(args.phases) <= {"baseline", "without", "with", "long"}:
        p.error("--phases takes a comma-separated list of baseline, without, with, long")
    if args.long_deadline is None:
        args.long_deadline = 0.3
    if not 0 <= args.slow_ms <= 10000:
        p.error("--slow-ms must be 0-10000")
    if not 1 <= args.concurrency <= 1000:
        p.error("--concurrency must be 1-1000")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_gateways:
        return gateways_main(json.loads(args.serve_gateways))
    if args.serve_clients:
        return clients_main(json.loads(args.serve_clients))
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
    raise_nofile(opts.clients + 4096)  # the gateways' process holds every client's socket
    return run_main("slow-gateway", lambda h: _slow_gateway(h, opts))


def _slow_gateway(h: Harness, opts: Options) -> None:
    api_key = secrets.token_urlsafe(24)
    h.env["IMROUTE_API_KEY"] = api_key
    # The push service opens its user directory at start: a migrated SQLite file of ours.
    h.env["IMROUTE_DB_URL"] = f"sqlite+aiosqlite:///{h.stack.log_dir / 'users.db'}"
    h.cond["redis_version"] = redis_version(h.redis_url)
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
    me = [sys.executable, os.path.abspath(__file__)]
    gateways = h.stack.spawn("gateways", [*me, "--serve-gateways", json.dumps(gw_spec)], pipes=True)
    cl_spec = {
        "urls": [f"ws://{HOST}:{ws}/ws" for ws, _ in ports.values()],
        "clients": opts.clients,
    }
    clients = h.stack.spawn("clients", [*me, "--serve-clients", json.dumps(cl_spec)], pipes=True)
    cpu_pids = {"gateways": gateways.pid, "clients": clients.pid, "loadgen": os.getpid()}
    if h.redis_pid:
        cpu_pids["redis"] = h.redis_pid
    run = Run(h, opts, api_key, Link("gateways", gateways), Link("clients", clients), cpu_pids)
    phases = len(opts.phases())
    result = run_async(lambda: bench(run), 120 + phases * (2 * opts.duration + 60))
    report(result, h.cond, opts)
    if opts.json_out:
        print(json.dumps({"conditions": h.cond, "results": result}))


if __name__ == "__main__":
    sys.exit(main())
