"""Broadcast benchmark: page a SQLite user directory of N users and publish each page once.

Setup (not timed): a temporary SQLite file, migrated with `router.directory.migrate.upgrade`
and filled with `SqlUserDirectory.upsert` in chunks of 10,000 `UserRecord`s: N users
(uid u0000000..), every 10th tagged `vip` (10 %), every 5th from the second on tagged
`beta` (20 %, so the tag index holds more than the tag asked for), the rest untagged.

Then, with a fresh directory engine and the real `RedisStreamsBus` (same Redis as the
push service, a unique key prefix), it times the push service's broadcast path twice:

    run_broadcast(directory.iter_pages(limit=1000), BatchPublisher(bus, message, 0, counters))
    run_broadcast(directory.iter_pages(limit=1000, tags_any=["vip"]), ...)

and reports pages/s, users/s, publishes (= ceil(users/1000)) and the total time, split
into directory paging, the bus (XADD) and the rest (Batch encoding, the loop), plus this
process's and Redis's CPU and the peak RSS growth. Afterwards it reads the broadcast
stream back and checks every user was published exactly once per run. The temporary
directory and every Redis key under the prefix are deleted at the end.

    .venv/bin/python -m bench.broadcast --quick
    .venv/bin/python -m bench.broadcast                  # 1,000,000 users
    .venv/bin/python -m bench.broadcast --users 200000 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import math
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bench.harness import stats
from bench.harness.cli import add_run_flags, parse_run_args
from bench.harness.counting import CountingPublisher, WireWrites, stream_entries
from bench.harness.counting import directory_uid as uid_of
from bench.harness.report import (
    MIB,
    machine_lines,
    mark,
    mib,
    profile_summary,
    redis_facts,
    versions,
)
from bench.harness.stack import BenchError, Harness, clean_up, run_async, run_main
from router.bus.redis_streams import DEFAULT_MAXLEN, RedisStreamsBus
from router.directory.base import MAX_UPSERT, UserRecord
from router.directory.migrate import upgrade
from router.directory.sql import SqlUserDirectory
from router.fanout.broadcast import run_broadcast
from router.fanout.publisher import BROADCAST_TOPIC, BatchPublisher
from router.jobs.base import PushCounters
from shared.clock import SystemClock
from shared.ids import new_id
from shared.keys import KeySchema
from shared.models import Message
from shared.proto import gateway_pb2

PAGE = 1000  # IMROUTE_BATCH_SIZE
TAG = "vip"
TIMEOUT_S = 170.0  # each async phase; a whole run stays well under three minutes
CONTENT = b'{"text":"broadcast bench"}'


def tags_of(i: int) -> tuple[str, ...]:
    if i % 10 == 0:
        return (TAG,)
    if i % 5 == 1:
        return ("beta",)
    return ()


def tagged(i: int) -> bool:
    return TAG in tags_of(i)


# --------------------------------------------------------------------------- setup


async def fill(url: str, n: int) -> float:
    """Migrate and fill the directory; returns the seconds taken."""
    started = time.perf_counter()
    await upgrade(url)
    async with SqlUserDirectory.from_url(url, SystemClock()) as directory:
        for start in range(0, n, MAX_UPSERT):
            records = [
                UserRecord(uid_of(i), tags_of(i)) for i in range(start, min(n, start + MAX_UPSERT))
            ]
            await directory.upsert(records)
        count = await directory.count()
    if count != n:
        raise BenchError(f"the directory holds {count} users, wanted {n}")
    return time.perf_counter() - started


# --------------------------------------------------------------------------- measurement


class TimedPages:
    """The directory's pages as run_broadcast sees them, timing each page query."""

    def __init__(self, pages: AsyncIterator[list[str]]) -> None:
        self._pages = pages
        self.count = 0
        self.users = 0
        self.seconds = 0.0
        self.slowest = 0.0

    def __aiter__(self) -> TimedPages:
        return self

    async def __anext__(self) -> list[str]:
        started = time.perf_counter()
        try:
            page = await anext(self._pages)
        finally:
            took = time.perf_counter() - started
            self.seconds += took
            self.slowest = max(self.slowest, took)
        self.count += 1
        self.users += len(page)
        return page


@dataclass
class Run:
    name: str
    expected: int
    push_id: str = ""
    seconds: float = 0.0
    pages: int = 0
    users: int = 0
    page_s: float = 0.0
    slowest_page_s: float = 0.0
    publishes: int = 0
    publish_s: float = 0.0
    publish_bytes: int = 0
    wire_writes: int = 0
    cpu_self_s: float = 0.0
    cpu_redis_s: float | None = None
    cpu_others_s: float = 0.0
    rss_before_kib: int = 0
    rss_peak_kib: int = 0
    profile: str = ""
    check: dict[str, int] = field(default_factory=dict)


async def measure(
    db_url: str,
    redis_url: str,
    prefix: str,
    n: int,
    maxlen: int,
    profile: bool,
    redis_pid: int | None,
) -> list[Run]:
    runs = [Run("everyone", n), Run(f"tags_any=[{TAG!r}]", sum(1 for i in range(n) if tagged(i)))]
    bus = RedisStreamsBus(redis_url, prefix, maxlen=maxlen)
    try:
        async with SqlUserDirectory.from_url(db_url, SystemClock()) as directory:
            await bus.transport._redis.ping()  # connect first: the run does not pay the handshake
            await directory.page(None, 1)  # nor the directory's
            for run, tags in zip(runs, (None, [TAG]), strict=True):
                await _one(run, directory, bus, tags, profile, redis_pid)
    finally:
        await bus.close()
    return runs


async def _one(
    run: Run,
    directory: SqlUserDirectory,
    bus: RedisStreamsBus,
    tags_any: list[str] | None,
    profile: bool,
    redis_pid: int | None,
) -> None:
    counters = PushCounters()
    publisher = CountingPublisher(bus)
    message = Message(new_id(), new_id(), 0, "admin", CONTENT, SystemClock().now_ms())
    run.push_id = message.push_id
    batches = BatchPublisher(publisher, message, 0, counters)
    gc.collect()
    stats.reset_peak_rss()
    run.rss_before_kib = stats.vm_kib()["VmRSS"]
    cpu = stats.CpuMeter(redis_pid).start()
    profiler = cProfile.Profile() if profile else None
    with WireWrites() as wire:
        if profiler is not None:
            profiler.enable()
        started = time.perf_counter()
        pages = TimedPages(directory.iter_pages(limit=PAGE, tags_any=tags_any))
        await run_broadcast(pages, batches)
        run.seconds = time.perf_counter() - started
        if profiler is not None:
            profiler.disable()
    cpu.stop()
    run.cpu_self_s, run.cpu_redis_s, run.cpu_others_s = cpu.self_s, cpu.redis_s, cpu.others_s
    run.rss_peak_kib = stats.vm_kib()["VmHWM"]
    run.wire_writes = wire.count
    run.pages, run.users, run.page_s = pages.count, pages.users, pages.seconds
    run.slowest_page_s = pages.slowest
    run.publishes, run.publish_s, run.publish_bytes = (
        publisher.count,
        publisher.seconds,
        publisher.bytes,
    )
    if counters.recipients != run.users or counters.published != publisher.count:
        raise BenchError(f"{run.name}: counters {counters} disagree with what was paged/sent")
    if profiler is not None:
        run.profile = profile_summary(profiler)


async def verify(redis_url: str, prefix: str, n: int, runs: Sequence[Run]) -> None:
    """Read the broadcast stream back: each run's users exactly once, and only those."""
    stream = KeySchema(prefix).bus_stream(BROADCAST_TOPIC)
    seen = {run.push_id: bytearray(n) for run in runs}
    problems = dict.fromkeys(seen, 0)
    tags_run = runs[1].push_id
    async for fields in stream_entries(redis_url, stream):
        push_id = fields.get(b"attr:push_id", b"").decode()
        batch = gateway_pb2.Batch.FromString(fields[b"data"])
        if push_id not in seen or batch.mode != gateway_pb2.MODE_BROADCAST:
            problems[push_id] = problems.get(push_id, 0) + 1
            continue
        marks = seen[push_id]
        for uid in batch.uids:
            i = int(uid[1:])
            if not 0 <= i < n or marks[i] or (push_id == tags_run and not tagged(i)):
                problems[push_id] += 1
                continue
            marks[i] = 1
    for run in runs:
        got = sum(seen[run.push_id])
        run.check = {
            "read_back": got,
            "missing": run.expected - got,
            "problems": problems[run.push_id],
        }


# --------------------------------------------------------------------------- report


def report(
    runs: Sequence[Run], cond: dict[str, str], fill_s: float, n: int
) -> list[dict[str, Any]]:
    lines = [
        "imroute broadcast benchmark (SqlUserDirectory.iter_pages -> run_broadcast ->"
        " BatchPublisher -> RedisStreamsBus)",
        "conditions:",
        *machine_lines(cond),
        f"  python      {cond['python']}  loop={cond['loop']}  redis-py {cond['redis']}"
        f"  hiredis {cond['hiredis']}  protobuf {cond['protobuf']}",
        f"  directory   SQLite {cond['sqlite']} (WAL, synchronous=NORMAL) via aiosqlite"
        f" {cond['aiosqlite']}, SQLAlchemy {cond['sqlalchemy']}; temp file"
        f" {cond['db_mib']} MiB (+ WAL {cond['wal_mib']} MiB); filled in {fill_s:.1f}s"
        " (not timed)",
        f"  users       {n:,} (uid u0000000..); {TAG!r} on every 10th (10 %), 'beta' on 20 %,"
        " the rest untagged",
        f"  redis       {cond['redis_server']} (server {cond['redis_version']}), prefix"
        f" {cond['prefix']!r}; bus maxlen {cond['maxlen']}",
        f"  path        in-process; keyset pages of {PAGE} uids, one Batch published per page to"
        f" {BROADCAST_TOPIC!r}; {len(CONTENT)}-byte content",
        "results:",
    ]
    out = []
    for run in runs:
        pages_rate = run.pages / run.seconds if run.seconds else math.inf
        users_rate = run.users / run.seconds if run.seconds else math.inf
        want = math.ceil(run.expected / PAGE)
        rest = run.seconds - run.page_s - run.publish_s
        lines += [
            f"  [{run.name}]",
            f"    total     {run.seconds:.2f}s for {run.users:,} users in {run.pages:,} pages",
            f"    rate      {pages_rate:,.0f} pages/s, {users_rate:,.0f} users/s",
            f"    publishes {run.publishes:,} (ceil({run.expected:,}/{PAGE}) = {want:,}:"
            f" {mark(run.publishes == want)}); {run.publish_bytes / MIB:.1f} MiB of batches;"
            f" redis-py socket writes {run.wire_writes:,}; naive 2 calls per user:"
            f" {2 * run.users:,}",
            f"    where     directory pages {run.page_s:.2f}s (slowest page"
            f" {1000 * run.slowest_page_s:.1f} ms), publishes {run.publish_s:.2f}s (XADD),"
            f" the rest {rest:.2f}s (Batch encoding, loop)",
            f"    cpu       this process {run.cpu_self_s:.2f}s (incl. aiosqlite's thread),"
            " redis-server "
            + (f"{run.cpu_redis_s:.2f}s" if run.cpu_redis_s is not None else "n/a")
            + f", other processes {run.cpu_others_s:.2f}s",
            f"    memory    RSS {mib(run.rss_before_kib):.0f} MiB before, peak"
            f" {mib(run.rss_peak_kib):.0f} MiB (+{mib(run.rss_peak_kib - run.rss_before_kib):.0f}"
            " MiB)",
            f"    check     {run.check['read_back']:,} uids read back from the stream,"
            f" {run.check['missing']:,} missing, {run.check['problems']:,}"
            " duplicate/untagged/other",
        ]
        out.append(
            {k: v for k, v in vars(run).items() if k != "profile"}
            | {"pages_per_s": pages_rate, "users_per_s": users_rate}
        )
    print("\n".join(lines), flush=True)
    for run in runs:
        if run.profile:
            print(f"\ncProfile of [{run.name}] (sorted by own time, then cumulative):")
            print(run.profile, flush=True)
    return out


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--users", type=int, default=1_000_000, help="directory users (1,000,000)")
    p.add_argument(
        "--maxlen", type=int, default=DEFAULT_MAXLEN, help=f"bus stream MAXLEN (~{DEFAULT_MAXLEN})"
    )
    p.add_argument("--profile", action="store_true", help="cProfile the measured runs")
    add_run_flags(p, "20,000 users")
    args = parse_run_args(p, argv, users=20_000)
    if not 1 <= args.users <= 2_000_000:
        p.error("--users must be 1-2,000,000")
    if args.maxlen < math.ceil(args.users / PAGE) * 1.2:
        p.error("--maxlen must hold every batch of both runs")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main("broadcast", lambda h: _broadcast(h, args))


def _broadcast(h: Harness, args: argparse.Namespace) -> None:
    n = args.users
    cond = dict(h.cond)
    cond["redis_server"] = cond.pop("redis")
    cond |= versions() | redis_facts(h.redis_url)
    cond |= {
        "sqlite": sqlite3.sqlite_version,
        "aiosqlite": version("aiosqlite"),
        "sqlalchemy": version("sqlalchemy"),
        "prefix": h.prefix,
        "maxlen": f"~{args.maxlen:,}",
    }
    tmp = Path(tempfile.mkdtemp(prefix="imroute-bench-broadcast-"))
    db = tmp / "users.db"
    db_url = f"sqlite+aiosqlite:///{db}"
    try:
        print(f"setup: filling a SQLite directory with {n:,} users ...", file=sys.stderr)
        fill_s = run_async(lambda: fill(db_url, n), TIMEOUT_S)
        print(f"setup: done in {fill_s:.1f}s; measuring ...", file=sys.stderr)
        runs = run_async(
            lambda: measure(
                db_url, h.redis_url, h.prefix, n, args.maxlen, args.profile, h.redis_pid
            ),
            TIMEOUT_S,
        )
        run_async(lambda: verify(h.redis_url, h.prefix, n, runs), TIMEOUT_S)
        wal = db.with_name(db.name + "-wal")
        cond["db_mib"] = f"{db.stat().st_size / MIB:.0f}"
        cond["wal_mib"] = f"{wal.stat().st_size / MIB:.0f}" if wal.exists() else "0"
        summary = report(runs, cond, fill_s, n)
        if args.json:
            print(json.dumps({"conditions": cond, "fill_s": fill_s, "runs": summary}, indent=2))
        if any(run.check["missing"] or run.check["problems"] for run in runs):
            raise BenchError("a broadcast did not publish every user exactly once")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        clean_up(h, also=f" and {tmp}")


if __name__ == "__main__":
    sys.exit(main())
