"""Group multicast benchmark: the real multicast path over N online recipients in Redis.

Setup (not timed): registers N fake online recipients in Redis under a unique key
prefix, spread over 4 groups with one fake gateway each (`RedisRouteRegistry.refresh`,
1000 registrations per pipelined round trip; no sockets). Then, in a fresh measurement
phase (a new event loop, new Redis clients), it runs the push service's multicast path
in-process:

    run_multicast(chunked(uids), registry, BatchPublisher(bus, message, 0, counters), clock)

with the real `RedisStreamsBus` on the same Redis and prefix as the publisher. The
registry reads routes the way it would on this client (`router.routes.reads`: one packed
request per chunk on standalone Redis); `--pipeline` forces redis-py's pipeline, the
path Redis Cluster takes, for comparison. It reports

- recipients/s from the start to the last publish;
- Redis round trips: look-ups (each read of up to 1000 route hashes is one request)
  plus publishes (one XADD each), cross-checked against every write redis-py made to a
  socket;
- publishes against ceil(N/1000) + groups, and the naive 2 calls per recipient;
- peak RSS of this process over idle, with and without the 1M-uid `to` list (the
  input), from VmHWM (reset through /proc/self/clear_refs) and from ru_maxrss;
- where the time went (look-ups, publishes, the rest), and this process's and Redis's CPU.

Afterwards it reads the group streams back and checks every recipient was published
exactly once, to its own group. With `--http` it also times the same multicast once
through `POST /v1/multicast` on a push service it starts (and stops by its PID). Every
key under its prefix is deleted at the end.

    .venv/bin/python bench/multicast.py --quick
    .venv/bin/python bench/multicast.py                        # 1,000,000 recipients
    .venv/bin/python bench/multicast.py --http                 # + once through the HTTP API
    .venv/bin/python bench/multicast.py --recipients 200000 --profile
    .venv/bin/python bench/multicast.py --pipeline             # the Redis Cluster read path
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import io
import json
import math
import os
import pstats
import resource
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import redis
import redis.asyncio as aioredis
import redis.asyncio.connection as aioredis_connection

# The helpers (process handling, machine facts, clean-up on signals) live next door.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from p2p import (
    HOST,
    BenchError,
    Harness,
    all_cpu,
    cpu_seconds,
    free_port,
    others_cpu,
    run_async,
    run_main,
)

from router.bus.redis_streams import DEFAULT_MAXLEN, RedisStreamsBus
from router.fanout.multicast import LOOKAHEAD, chunked, run_multicast
from router.fanout.publisher import BatchPublisher, PushCounters, group_topic
from router.redis.client import create_redis
from router.routes.reads import HashReads, PipelineHashReads, hash_reads_for
from router.routes.registry import (
    LOOKUP_CHUNK,
    GroupLookup,
    RecipientGroups,
    RedisRouteRegistry,
    Registration,
)
from shared.clock import SystemClock
from shared.ids import new_id
from shared.keys import KeySchema
from shared.models import Message
from shared.proto import gateway_pb2

GROUPS = 4
ROUTE_TTL_S = 900.0  # the routes must outlive the setup and the run; the keys expire anyway
TARGET_RATE = 250_000  # recipients/s
TARGET_RSS_MB = 300
ROUND_TRIP_SLACK = 8  # "a small constant" over ceil(N/1000) look-up round trips
TIMEOUT_S = 170.0  # each async phase; a whole run stays well under three minutes
CONTENT = b'{"text":"multicast bench"}'
MIB = 1 << 20


def uid_of(i: int) -> str:
    return f"u{i:07d}"


def group_of(i: int, groups: int) -> str:
    return f"g{i % groups + 1}"


# --------------------------------------------------------------------------- memory


def proc_status() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in KiB."""
    out: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(rest.split()[0])
    return out


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False when not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def ru_maxrss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def process_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class RssSampler:
    """Samples VmRSS every `interval_s` on a thread: a check of VmHWM that needs no reset."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self.peak_kib = 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_kib = max(self.peak_kib, proc_status()["VmRSS"])
            self._stop.wait(self._interval)

    def __enter__(self) -> RssSampler:
        self.peak_kib = proc_status()["VmRSS"]
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_kib = max(self.peak_kib, proc_status()["VmRSS"])


# --------------------------------------------------------------------------- counting


class CountingReads:
    """The registry's route reads: counts requests (one round trip each, either path)
    and route hashes read, and the time spent in them (send + Redis + read + parse)."""

    def __init__(self, inner: HashReads) -> None:
        self.inner = inner
        self.requests = 0
        self.keys = 0
        self.seconds = 0.0

    async def hgetall(self, keys: Sequence[str]) -> list[Mapping[str, str]]:
        raise BenchError("multicast should read route values only (HVALS), not HGETALL")

    async def hvals(self, keys: Sequence[str], prefix: str = "") -> list[list[str]]:
        self.requests += 1
        self.keys += len(keys)
        started = time.perf_counter()
        try:
            return await self.inner.hvals(keys, prefix)
        finally:
            self.seconds += time.perf_counter() - started


class TimedRegistry:
    """The registry as run_multicast sees it, timing each look-up (round trip + decoding).
    Look-ups overlap (run_multicast keeps several in flight), so the sum can exceed the
    wall time."""

    def __init__(self, inner: RedisRouteRegistry) -> None:
        self._inner = inner
        self.calls = 0
        self.seconds = 0.0

    async def lookup_groups(self, uids: Sequence[str]) -> RecipientGroups:
        started = time.perf_counter()
        try:
            return await self._inner.lookup_groups(uids)
        finally:
            self.calls += 1
            self.seconds += time.perf_counter() - started


class CountingPublisher:
    """The bus as BatchPublisher sees it: counts publishes (one XADD round trip each)."""

    def __init__(self, bus: RedisStreamsBus) -> None:
        self._bus = bus
        self.count = 0
        self.bytes = 0
        self.seconds = 0.0
        self.last_done = 0.0
        self.per_topic: dict[str, int] = {}

    async def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None
    ) -> str:
        started = time.perf_counter()
        entry_id = await self._bus.publish(topic, data, attributes)
        self.last_done = time.perf_counter()
        self.seconds += self.last_done - started
        self.count += 1
        self.bytes += len(data)
        self.per_topic[topic] = self.per_topic.get(topic, 0) + 1
        return entry_id


class WireWrites:
    """Counts every write redis-py's asyncio connections make (a command or a pipeline
    is one write; connection handshakes and health checks count too)."""

    def __init__(self) -> None:
        self.count = 0
        self._cls = aioredis_connection.AbstractConnection
        self._original = self._cls.send_packed_command

    def __enter__(self) -> WireWrites:
        original = self._original

        async def counted(conn: Any, command: Any, check_health: bool = True) -> None:
            self.count += 1
            await original(conn, command, check_health)

        self._cls.send_packed_command = counted  # type: ignore[assignment,method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        self._cls.send_packed_command = self._original  # type: ignore[method-assign]


# --------------------------------------------------------------------------- redis helpers


def redis_facts(url: str) -> dict[str, str]:
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        server = client.info("server")
        memory = client.info("memory")
    finally:
        client.close()
    return {
        "redis_version": str(server.get("redis_version")),
        "redis_used_mib": f"{int(memory['used_memory']) / MIB:.0f}",
    }


def redis_used_mib(url: str) -> float:
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        return int(client.info("memory")["used_memory"]) / MIB
    finally:
        client.close()


def drop_prefix(url: str, prefix: str) -> int:
    """Delete every key under `prefix` (SCAN + UNLINK, 1000 at a time); returns how many."""
    client = redis.Redis.from_url(url, socket_timeout=30)
    deleted = 0
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{prefix}*", count=5000):
            batch.append(key)
            if len(batch) == 1000:
                deleted += int(client.unlink(*batch))
                batch.clear()
        if batch:
            deleted += int(client.unlink(*batch))
    finally:
        client.close()
    return deleted


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("redis", "hiredis", "protobuf", "uvloop"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


# --------------------------------------------------------------------------- setup


async def register_online(url: str, keys: KeySchema, n: int, groups: int) -> float:
    """Register uid i on the fake gateway of group i % groups; returns the seconds taken."""
    started = time.perf_counter()
    client = create_redis(url)
    try:
        registries = [
            RedisRouteRegistry(
                client,
                keys,
                SystemClock(),
                ttl_s=ROUTE_TTL_S,
                gateway_id=f"bench-gw{g + 1}",
                group_id=f"g{g + 1}",
                ip="127.0.0.1",
                port=9001 + g,
            )
            for g in range(groups)
        ]
        counts = await asyncio.gather(
            *(
                registry.refresh(
                    Registration(uid_of(i), f"bench-gw{g + 1}.c{i}") for i in range(g, n, groups)
                )
                for g, registry in enumerate(registries)
            )
        )
    finally:
        await client.aclose()
    if sum(counts) != n:
        raise BenchError(f"registered {sum(counts)} recipients, wanted {n}")
    return time.perf_counter() - started


# --------------------------------------------------------------------------- measurement


@dataclass
class Result:
    recipients: int
    groups: int
    seconds: float = 0.0  # start -> last publish done
    seconds_total: float = 0.0  # start -> run_multicast returned
    online: int = 0
    offline: int = 0
    lookups: int = 0
    lookup_round_trips: int = 0
    lookup_commands: int = 0
    lookup_s: float = 0.0
    lookup_read_s: float = 0.0
    lookahead: int = 0
    read_path: str = ""
    publishes: int = 0
    publish_s: float = 0.0
    publish_bytes: int = 0
    per_topic: dict[str, int] = field(default_factory=dict)
    wire_writes: int = 0
    cpu_self_s: float = 0.0
    cpu_redis_s: float | None = None
    cpu_others_s: float = 0.0
    rss_idle_kib: int = 0
    rss_with_list_kib: int = 0
    rss_peak_kib: int = 0
    rss_sampled_peak_kib: int = 0
    rss_after_kib: int = 0
    hwm_reset: bool = False
    ru_maxrss_before_kib: int = 0
    ru_maxrss_after_kib: int = 0
    list_build_s: float = 0.0
    profile: str = ""


async def measure(
    url: str,
    prefix: str,
    n: int,
    groups: int,
    maxlen: int,
    profile: bool,
    redis_pid: int | None,
    pipeline: bool,
    lookahead: int,
) -> Result:
    """The timed multicast, with fresh clients; memory is read around building the input."""
    r = Result(n, groups)
    keys = KeySchema(prefix)
    client = create_redis(url)
    bus = RedisStreamsBus(url, prefix, maxlen=maxlen)
    try:
        # Open the connections first, so the run does not pay the handshakes: the bus uses
        # one, the registry's client up to lookahead + 1 (one per look-up in flight).
        await asyncio.gather(*(client.ping() for _ in range(lookahead + 1)))
        await bus.transport._redis.ping()
        inner_reads = PipelineHashReads(client) if pipeline else hash_reads_for(client)
        r.read_path, r.lookahead = type(inner_reads).__name__, lookahead
        counting = CountingReads(inner_reads)
        timed = TimedRegistry(RedisRouteRegistry(client, keys, SystemClock(), reads=counting))
        registry = cast(GroupLookup, timed)
        publisher = CountingPublisher(bus)
        counters = PushCounters()
        now = SystemClock().now_ms()
        message = Message(new_id(), new_id(), 0, "admin", CONTENT, now)
        batches = BatchPublisher(publisher, message, 0, counters)

        gc.collect()
        r.ru_maxrss_before_kib = ru_maxrss_kib()
        r.hwm_reset = reset_peak_rss()
        r.rss_idle_kib = proc_status()["VmRSS"]
        started = time.perf_counter()
        uids = [uid_of(i) for i in range(n)]  # the input: what a 1M-uid `to` holds
        r.list_build_s = time.perf_counter() - started
        r.rss_with_list_kib = proc_status()["VmRSS"]

        cpu_before, everyone_before = process_cpu_s(), all_cpu()
        redis_before = cpu_seconds(redis_pid) if redis_pid else None
        profiler = cProfile.Profile() if profile else None
        with RssSampler() as sampler, WireWrites() as wire:
            if profiler is not None:
                profiler.enable()
            started = time.perf_counter()
            await run_multicast(
                chunked(uids), registry, batches, SystemClock(), lookahead=lookahead
            )
            r.seconds_total = time.perf_counter() - started
            if profiler is not None:
                profiler.disable()
        r.seconds = (publisher.last_done or time.perf_counter()) - started
        r.cpu_self_s = process_cpu_s() - cpu_before
        redis_after = cpu_seconds(redis_pid) if redis_pid else None
        if redis_before is not None and redis_after is not None:
            r.cpu_redis_s = redis_after - redis_before
        mine = {os.getpid()} | ({redis_pid} if redis_pid else set())
        r.cpu_others_s = others_cpu(everyone_before, all_cpu(), mine)
        status = proc_status()
        r.rss_peak_kib, r.rss_after_kib = status["VmHWM"], status["VmRSS"]
        r.rss_sampled_peak_kib = sampler.peak_kib
        r.ru_maxrss_after_kib = ru_maxrss_kib()
        r.wire_writes = wire.count

        r.online, r.offline = counters.online, counters.offline
        r.lookups, r.lookup_s = timed.calls, timed.seconds
        r.lookup_round_trips, r.lookup_commands = counting.requests, counting.keys
        r.lookup_read_s = counting.seconds
        r.publishes, r.publish_s, r.publish_bytes = (
            publisher.count,
            publisher.seconds,
            publisher.bytes,
        )
        r.per_topic = dict(sorted(publisher.per_topic.items()))
        if counters.published != publisher.count:
            raise BenchError(
                f"counters say {counters.published} published, the bus saw {publisher.count}"
            )
        if profiler is not None:
            r.profile = profile_summary(profiler)
        del uids
    finally:
        await bus.close()
        await client.aclose()
    return r


def profile_summary(profiler: cProfile.Profile, top: int = 25) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats(pstats.SortKey.TIME).print_stats(top)
    stats.sort_stats(pstats.SortKey.CUMULATIVE).print_stats(top)
    return out.getvalue()


async def verify(url: str, prefix: str, n: int, groups: int) -> dict[str, int]:
    """Read the group streams back: every recipient exactly once, in its own group."""
    keys = KeySchema(prefix)
    bus_client = aioredis.Redis.from_url(url, decode_responses=False)
    seen = bytearray(n)
    per_group: dict[str, int] = {}
    problems = 0
    try:
        for g in range(groups):
            group = f"g{g + 1}"
            stream = keys.bus_stream(group_topic(group))
            start = "-"
            while True:
                entries = await bus_client.xrange(stream, min=start, count=200)
                if not entries:
                    break
                for _entry_id, fields in entries:
                    batch = gateway_pb2.Batch.FromString(fields[b"data"])
                    if batch.group_id != group or batch.mode != gateway_pb2.MODE_MULTICAST:
                        problems += 1
                    for uid in batch.uids:
                        i = int(uid[1:])
                        if not 0 <= i < n or group_of(i, groups) != group or seen[i]:
                            problems += 1
                            continue
                        seen[i] = 1
                    per_group[group] = per_group.get(group, 0) + len(batch.uids)
                start = "(" + entries[-1][0].decode()  # exclusive: after the last one
    finally:
        await bus_client.aclose()
    return {
        "published_uids": sum(per_group.values()),
        "missing": n - sum(seen),
        "problems": problems,
    }


# --------------------------------------------------------------------------- HTTP


def http_multicast(h: Harness, n: int, groups: int) -> dict[str, Any]:
    """Start a push service (stopped by PID with the harness), POST one multicast to all
    N recipients and wait for its job to finish."""
    api_key = secrets.token_urlsafe(24)
    port = free_port()
    h.env.update(
        IMROUTE_API_KEY=api_key,
        IMROUTE_DB_URL=f"sqlite+aiosqlite:///{h.stack.log_dir / 'users.db'}",
    )
    proc = h.stack.spawn(
        "push-service", [sys.executable, "-m", "push_service", "--host", HOST, "--port", str(port)]
    )
    base = f"http://{HOST}:{port}"
    headers = {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=base, headers=headers, timeout=120) as http:
        deadline = time.monotonic() + 30
        while True:
            h.stack.check()
            with contextlib.suppress(httpx.HTTPError):
                if http.get("/healthz").status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise BenchError("the push service did not answer /healthz within 30s")
            time.sleep(0.1)
        idle = _child_status(proc.pid)
        body = json.dumps(
            {"to": [uid_of(i) for i in range(n)], "content": json.loads(CONTENT)},
            separators=(",", ":"),
        ).encode()
        body_mib = len(body) / MIB
        cpu_before = cpu_seconds(proc.pid) or 0.0
        started = time.perf_counter()
        resp = http.post(
            "/v1/multicast", content=body, headers={"Content-Type": "application/json"}
        )
        accepted = time.perf_counter() - started
        if resp.status_code != 202:
            raise BenchError(f"POST /v1/multicast answered {resp.status_code}: {resp.text[:300]}")
        push_id = resp.json()["push_id"]
        del body
        job: dict[str, Any] = {}
        polls: list[float] = []  # how long the busy push service takes to answer a GET
        while time.perf_counter() - started < 150:
            asked = time.perf_counter()
            job = http.get(f"/v1/pushes/{push_id}").json()
            polls.append(time.perf_counter() - asked)
            if job.get("status") in ("done", "failed"):
                break
            time.sleep(0.02)
        done = time.perf_counter() - started
        cpu = (cpu_seconds(proc.pid) or 0.0) - cpu_before
        peak = _child_status(proc.pid)
    if job.get("status") != "done":
        raise BenchError(f"multicast job did not finish: {job}")
    return {
        "accepted_s": accepted,
        "done_s": done,
        "job_s": (job["finished_at"] - job["created_at"]) / 1000,
        "job": job,
        "cpu_s": cpu,
        "rss_idle_kib": idle["VmRSS"],
        "rss_peak_kib": peak["VmHWM"],
        "body_mib": body_mib,
        "polls": len(polls),
        "poll_p50_ms": 1000 * statistics.median(polls),
        "poll_max_ms": 1000 * max(polls),
    }


def _child_status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(rest.split()[0])
    return out


# --------------------------------------------------------------------------- report


def mib(kib: int) -> float:
    return kib / 1024


def mark(ok: bool) -> str:
    return "met" if ok else "MISSED"


def report(
    r: Result,
    cond: Mapping[str, str],
    setup_s: float,
    check: Mapping[str, int],
    http: Mapping[str, Any] | None,
) -> dict[str, Any]:
    n, groups = r.recipients, r.groups
    chunks = math.ceil(n / LOOKUP_CHUNK)
    rate = n / r.seconds if r.seconds else math.inf
    round_trips = r.lookup_round_trips + r.publishes
    naive = 2 * n
    growth_total = mib(r.rss_peak_kib - r.rss_idle_kib)
    growth_run = mib(r.rss_peak_kib - r.rss_with_list_kib)
    lines = [
        "imroute group multicast benchmark (run_multicast -> BatchPublisher -> RedisStreamsBus)",
        "conditions:",
        f"  date        {cond['date']}",
        f"  machine     nproc={cond['nproc']}  cpu={cond['cpu']}  ram={cond['ram']}"
        f"  kernel={cond['kernel']}",
        f"  python      {cond['python']}  loop={cond['loop']}  redis-py {cond['redis']}"
        f"  hiredis {cond['hiredis']}  protobuf {cond['protobuf']}",
        f"  redis       {cond['redis_server']} (server {cond['redis_version']}), prefix"
        f" {cond['prefix']!r}; used memory {cond['redis_used_mib']} MiB before setup,"
        f" {cond['redis_loaded_mib']} MiB with the routes",
        f"  recipients  {n:,} online (uid u0000000.., 1 route each), {groups} groups with one"
        f" fake gateway each, uid i in group i % {groups}; registered in {setup_s:.1f}s"
        " (not timed)",
        f"  path        in-process; chunks of {LOOKUP_CHUNK} (one round trip of HVALS each,"
        f" through {r.read_path}), {r.lookahead} look-ups in flight, batch size 1000, flush"
        f" timeout 1 s, normal priority; bus maxlen"
        f" {cond['maxlen']}; {len(CONTENT)}-byte content",
        "results:",
        f"  time        {r.seconds:.2f}s start -> last publish ({r.seconds_total:.2f}s until"
        f" run_multicast returned)",
        f"  rate        {rate:,.0f} recipients/s   target >= {TARGET_RATE:,}:"
        f" {mark(rate >= TARGET_RATE)}",
        f"  counted     {r.online:,} online, {r.offline:,} offline",
        f"  publishes   {r.publishes:,} (per topic {r.per_topic}); ceil(N/1000) + groups ="
        f" {chunks + groups:,}: {mark(r.publishes <= chunks + groups)};"
        f" {r.publish_bytes / MIB:.1f} MiB of batches",
        f"  look-ups    {r.lookup_round_trips:,} round trips for {r.lookup_commands:,}"
        f" HVALS; ceil(N/1000) + {ROUND_TRIP_SLACK} = {chunks + ROUND_TRIP_SLACK:,}:"
        f" {mark(r.lookup_round_trips <= chunks + ROUND_TRIP_SLACK)}",
        f"  round trips {round_trips:,} = {r.lookup_round_trips:,} look-ups + {r.publishes:,}"
        f" XADDs (redis-py socket writes during the run: {r.wire_writes:,});"
        f" naive 2 calls per recipient: {naive:,} ({naive / max(round_trips, 1):,.0f}x more)",
        f"  where       look-up calls {r.lookup_s:.2f}s summed (of which route reads"
        f" {r.lookup_read_s:.2f}s; up to {r.lookahead} overlap, so the sum can exceed the wall"
        f" time), publishes {r.publish_s:.2f}s (XADD); --profile splits the CPU time",
        f"  cpu         this process {r.cpu_self_s:.2f}s"
        f" ({100 * r.cpu_self_s / max(r.seconds_total, 1e-9):.0f}% of a core), redis-server"
        + (
            f" {r.cpu_redis_s:.2f}s ({100 * r.cpu_redis_s / max(r.seconds_total, 1e-9):.0f}%)"
            if r.cpu_redis_s is not None
            else " n/a"
        )
        + f", other processes {r.cpu_others_s:.2f}s",
        f"  memory      RSS idle {mib(r.rss_idle_kib):.0f} MiB -> {mib(r.rss_with_list_kib):.0f}"
        f" MiB with the {n:,}-uid list (built in {r.list_build_s:.2f}s) -> peak"
        f" {mib(r.rss_peak_kib):.0f} MiB (VmHWM{'' if r.hwm_reset else ', NOT reset'};"
        f" sampled peak {mib(r.rss_sampled_peak_kib):.0f} MiB) -> {mib(r.rss_after_kib):.0f}"
        " MiB after",
        f"  peak growth {growth_total:.0f} MiB over idle incl. the list, {growth_run:.0f} MiB over"
        f" idle + list; target < {TARGET_RSS_MB} MB:"
        f" {mark(growth_total * MIB < TARGET_RSS_MB * 1e6)}",
        f"  ru_maxrss   {mib(r.ru_maxrss_before_kib):.0f} MiB before ->"
        f" {mib(r.ru_maxrss_after_kib):.0f} MiB after (process-lifetime peak;"
        " includes the setup phase)",
        f"  check       {check['published_uids']:,} uids read back from the group streams,"
        f" {check['missing']:,} missing, {check['problems']:,} wrong group/duplicate/other",
    ]
    if http is not None:
        job = http["job"]
        lines += [
            "HTTP API (POST /v1/multicast on a push service child process, uvicorn):",
            f"  body        {http['body_mib']:.1f} MiB JSON; 202 after {http['accepted_s']:.2f}s"
            " (upload, parse, validation)",
            f"  job         {job['status']}: {job['recipients']:,} recipients, {job['online']:,}"
            f" online, {job['published']:,} published; job ran {http['job_s']:.2f}s;"
            f" POST -> done seen {http['done_s']:.2f}s"
            f" ({n / max(http['done_s'], 1e-9):,.0f} recipients/s end to end)",
            f"  push svc    CPU {http['cpu_s']:.2f}s; RSS idle {mib(http['rss_idle_kib']):.0f} MiB,"
            f" peak {mib(http['rss_peak_kib']):.0f} MiB",
            f"  meanwhile   {http['polls']} GET /v1/pushes/<id> answered in median"
            f" {http['poll_p50_ms']:.1f} ms, max {http['poll_max_ms']:.1f} ms (the job shares"
            " the push service's event loop)",
        ]
    print("\n".join(lines), flush=True)
    if r.profile:
        print("\ncProfile of the measured run (sorted by own time, then cumulative):")
        print(r.profile, flush=True)
    return {
        "conditions": dict(cond),
        "setup_s": setup_s,
        "rate": rate,
        "round_trips": round_trips,
        "naive_calls": naive,
        "check": dict(check),
        "http": {k: v for k, v in (http or {}).items()},
        **{k: v for k, v in vars(r).items() if k != "profile"},
    }


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--recipients", type=int, default=1_000_000, help="online recipients (1,000,000)"
    )
    p.add_argument(
        "--groups", type=int, default=GROUPS, help=f"groups, one gateway each ({GROUPS})"
    )
    p.add_argument(
        "--maxlen", type=int, default=DEFAULT_MAXLEN, help=f"bus stream MAXLEN (~{DEFAULT_MAXLEN})"
    )
    p.add_argument("--profile", action="store_true", help="cProfile the measured run")
    p.add_argument(
        "--lookahead",
        type=int,
        default=LOOKAHEAD,
        help=f"look-ups in flight at once ({LOOKAHEAD}, run_multicast's default)",
    )
    p.add_argument(
        "--pipeline",
        action="store_true",
        help="read routes through redis-py's pipeline (the Redis Cluster path)",
    )
    p.add_argument("--http", action="store_true", help="also time it once through the HTTP API")
    p.add_argument("--quick", action="store_true", help="smoke run: 20,000 recipients")
    p.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = p.parse_args(argv)
    if args.quick:
        args.recipients = 20_000
    if not 1 <= args.recipients <= 2_000_000:
        p.error("--recipients must be 1-2,000,000")
    if not 1 <= args.groups <= 64:
        p.error("--groups must be 1-64")
    if args.lookahead < 1:
        p.error("--lookahead must be at least 1")
    if args.maxlen < 2 * math.ceil(args.recipients / 1000) + args.groups:
        p.error("--maxlen must hold every batch of the run (and of --http)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main("multicast", lambda h: _multicast(h, args))


def _multicast(h: Harness, args: argparse.Namespace) -> None:
    n, groups = args.recipients, args.groups
    cond = dict(h.cond)
    cond["redis_server"] = cond.pop("redis")
    cond |= versions() | redis_facts(h.redis_url)
    cond["prefix"], cond["maxlen"] = h.prefix, f"~{args.maxlen:,}"
    keys = h.keys
    try:
        print(f"setup: registering {n:,} recipients in {groups} groups ...", file=sys.stderr)
        setup_s = run_async(lambda: register_online(h.redis_url, keys, n, groups), TIMEOUT_S)
        cond["redis_loaded_mib"] = f"{redis_used_mib(h.redis_url):.0f}"
        print(f"setup: done in {setup_s:.1f}s; measuring ...", file=sys.stderr)
        result = run_async(
            lambda: measure(
                h.redis_url,
                h.prefix,
                n,
                groups,
                args.maxlen,
                args.profile,
                h.redis_pid,
                args.pipeline,
                args.lookahead,
            ),
            TIMEOUT_S,
        )
        check = run_async(lambda: verify(h.redis_url, h.prefix, n, groups), TIMEOUT_S)
        http = http_multicast(h, n, groups) if args.http else None
        summary = report(result, cond, setup_s, check, http)
        if args.json:
            print(json.dumps(summary, indent=2, default=str))
        if check["missing"] or check["problems"] or result.online != n:
            raise BenchError("the multicast did not publish every recipient exactly once")
    finally:
        h.stack.stop()
        started = time.perf_counter()
        deleted = drop_prefix(h.redis_url, h.prefix)
        print(
            f"clean-up: deleted {deleted:,} keys under {h.prefix!r} in"
            f" {time.perf_counter() - started:.1f}s",
            file=sys.stderr,
        )


if __name__ == "__main__":
    sys.exit(main())
