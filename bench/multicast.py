"""Group multicast benchmark: the real multicast path over N online recipients in Redis.

Setup (not timed): registers N fake online recipients in Redis under a unique key
prefix, spread over 4 groups with one fake gateway each (`RedisRouteRegistry.refresh`,
1000 registrations per pipelined round trip; no sockets). Then, in a fresh measurement
phase (a new event loop, new Redis clients), it runs the push service's multicast path
in-process:

    run_multicast(chunked(uids), registry, BatchPublisher(bus, message, 0, counters), clock)

with the real `RedisStreamsBus` on the same Redis and prefix as the publisher. The
registry reads routes the way it would on this client (`router.routes.registry`: one packed
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

    .venv/bin/python -m bench.multicast --quick
    .venv/bin/python -m bench.multicast                        # 1,000,000 recipients
    .venv/bin/python -m bench.multicast --http                 # + once through the HTTP API
    .venv/bin/python -m bench.multicast --recipients 200000 --profile
    .venv/bin/python -m bench.multicast --pipeline             # the Redis Cluster read path
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import gc
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from typing import cast

from bench.harness.cli import add_run_flags, parse_run_args
from bench.harness.counting import CountingPublisher, WireWrites, directory_uid
from bench.harness.report import profile_summary, redis_facts, versions
from bench.harness.stack import BenchError, Harness, clean_up, run_async, run_main
from bench.harness.stats import CpuMeter, RssSampler, reset_peak_rss, ru_maxrss_kib, vm_kib
from bench.multicast_report import CONTENT, GROUPS, Result, http_multicast, report, verify
from router.bus.base import group_topic
from router.bus.redis_streams import DEFAULT_MAXLEN, RedisStreamsBus, stream_key
from router.fanout.multicast import LOOKAHEAD, chunked, run_multicast
from router.fanout.publisher import BatchPublisher
from router.jobs.base import PushCounters
from router.recovery.base import RecoveryLimits
from router.recovery.store import RedisRecoveryStore
from router.redis.client import RedisClient, create_redis
from router.routes.base import GroupLookup, RecipientGroups
from router.routes.registry import (
    HashReads,
    PipelineHashReads,
    RedisRouteRegistry,
    Registration,
    hash_reads_for,
)
from shared.clock import SystemClock
from shared.errors import RegistryRefused
from shared.ids import new_id
from shared.keys import KeySchema
from shared.models import Message

ROUTE_TTL_S = 900.0  # the routes must outlive the setup and the run; the keys expire anyway
TIMEOUT_S = 170.0  # each async phase; a whole run stays well under three minutes
uid_of = directory_uid

# --------------------------------------------------------------------------- counting


class CountingReads:
    """The registry's route reads: counts requests (one round trip each, either path)
    and route hashes read, and the time spent in them (send + Redis + read + parse)."""

    def __init__(self, inner: HashReads) -> None:
        self.inner = inner
        self.requests = 0
        self.keys = 0
        self.seconds = 0.0

    async def hgetall(self, keys: Sequence[str]) -> Sequence[Mapping[str, str] | RegistryRefused]:
        raise BenchError("multicast should read route values only (HVALS), not HGETALL")

    async def hvals(
        self, keys: Sequence[str], prefix: str = ""
    ) -> Sequence[list[str] | RegistryRefused]:
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
        written = await asyncio.gather(
            *(
                registry.refresh(
                    Registration(uid_of(i), f"bench-gw{g + 1}.c{i}") for i in range(g, n, groups)
                )
                for g, registry in enumerate(registries)
            )
        )
    finally:
        await client.aclose()
    # Fresh keys: every route is written anew.
    if sum(map(len, written)) != n:
        raise BenchError(f"registered {sum(map(len, written))} recipients, wanted {n}")
    return time.perf_counter() - started


# --------------------------------------------------------------------------- measurement


async def _hold_topics(client: RedisClient, prefix: str, groups: int) -> None:
    for g in range(groups):
        key = stream_key(prefix, group_topic(f"g{g + 1}"))
        await client.xgroup_create(key, "bench-reader", id="$", mkstream=True)
        await client.xgroup_createconsumer(key, "bench-reader", "bench")


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
    recovery: bool = True,
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
        # A reader on each group's topic, as its gateway would be (a consumer group at the
        # end of the stream): with none, nothing needs the batches and each publish trims
        # its stream, so the read-back check below would find them gone.
        await _hold_topics(client, prefix, groups)
        inner_reads = PipelineHashReads(client) if pipeline else hash_reads_for(client)
        r.read_path, r.lookahead = type(inner_reads).__name__, lookahead
        counting = CountingReads(inner_reads)
        timed = TimedRegistry(RedisRouteRegistry(client, keys, SystemClock(), reads=counting))
        registry = cast(GroupLookup, timed)
        publisher = CountingPublisher(bus)
        counters = PushCounters()
        now = SystemClock().now_ms()
        message = Message(new_id(), new_id(), 0, "admin", CONTENT, now)
        # As the push service does (a push is stored by default): each batch logged first.
        log = (
            RedisRecoveryStore(client, keys, SystemClock(), RecoveryLimits()) if recovery else None
        )
        batches = BatchPublisher(publisher, message, 0, counters, log)
        r.read_path += " + recovery log" if recovery else " (recovery off)"

        gc.collect()
        r.ru_maxrss_before_kib = ru_maxrss_kib()
        r.hwm_reset = reset_peak_rss()
        r.rss_idle_kib = vm_kib()["VmRSS"]
        started = time.perf_counter()
        uids = [uid_of(i) for i in range(n)]  # the input: what a 1M-uid `to` holds
        r.list_build_s = time.perf_counter() - started
        r.rss_with_list_kib = vm_kib()["VmRSS"]

        cpu = CpuMeter(redis_pid).start()
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
        cpu.stop()
        r.cpu_self_s, r.cpu_redis_s, r.cpu_others_s = cpu.self_s, cpu.redis_s, cpu.others_s
        status = vm_kib()
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
    p.add_argument("--recovery", choices=["on", "off"], default="on", help="log each batch (on)")
    add_run_flags(p, "20,000 recipients")
    args = parse_run_args(p, argv, recipients=20_000)
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
    return run_main("multicast", functools.partial(_multicast, args=parse_args(argv)))


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
        cond["redis_loaded_mib"] = redis_facts(h.redis_url)["redis_used_mib"]
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
                args.recovery == "on",
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
        h.stack.stop_all()
        clean_up(h)


if __name__ == "__main__":
    sys.exit(main())
