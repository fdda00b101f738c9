"""Hedged publishing benchmark: the tail latency hedging buys, and what it costs.

The real path: `router.bus.pubsub.PubSubBus` -> google-cloud-pubsub's PublisherAsyncClient
-> real gRPC over loopback -> `tests.latency_publisher.LatencyPublisher`, a Publisher
server that makes each call fast or slow. Publishes start on an open-loop schedule
(publish i is due at t0 + i/rate, each in its own task, whatever the earlier ones do).

1. Mixed latency: each server call (original or hedge) takes `--slow-s` (2 s) with
   probability `--slow-fraction` (5 %), decided per call by a seeded RNG, else
   `--fast-s` (5 ms). Run with hedging off, at a fixed 100 ms, and "auto". Reported:
   p50/p99/p99.9 publish latency, extra RPCs (server calls / publishes - 1), hedge wins,
   and the topic's hedge tokens sampled over time.
2. Sustained slowdown: the same mix for `--warm-s`, then every call takes `--slow-s`
   for `--slowdown-s`; hedges per second, for fixed 100 ms and "auto", with calls that
   are slow but succeed, and with calls that time out (1.5 s per-attempt timeout).

Everything runs in this process, on one asyncio event loop; the server, the bus and
every task are stopped on exit, Ctrl-C, SIGTERM and errors. From the repository root:

    .venv/bin/python bench/hedging.py --quick
    .venv/bin/python bench/hedging.py --png docs/hedging_cdf.png
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import platform
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

# Run as `bench/hedging.py` from the repository root: `tests` and the packages resolve.
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from router.bus import BROADCAST, group_topic  # noqa: E402
from router.bus.pubsub import PubSubBus  # noqa: E402
from router.devtools.latency_publisher import Behaviour, Call, LatencyPublisher  # noqa: E402
from router.devtools.procs import die_with_parent  # noqa: E402
from router.hedging import AUTO, HedgingSettings, RetrySettings  # noqa: E402
from shared.errors import BusUnavailable  # noqa: E402

T = TypeVar("T")

PROJECT = "imroute-bench"
PREFIX = "bench-hedging:"
TOPIC = BROADCAST
MEASURED_SUFFIX = f"~{TOPIC}"  # the end of the measured topic's Pub/Sub path
WARMUP_TOPIC = group_topic("warmup")  # a bucket of its own: the measured one starts empty
WARMUP_PUBLISHES = 50
PAYLOAD = bytes(10_000)  # about one 1000-uid batch
SAMPLE_EVERY_S = 0.1
OVERALL_TIMEOUT_S = 900.0
SERVER_START_S = 30.0
SERVER_ANSWER_S = 30.0
HEDGE_DELAY_S = 0.1
# Calls that time out: the per-attempt timeout is below the slow calls' 2 s, and the
# total timeout leaves no room for a retry, so every server call is an original or a hedge.
TIMEOUT_RETRY = RetrySettings(initial_rpc_timeout_s=1.5, max_rpc_timeout_s=1.5, total_timeout_s=1.5)
# Dean & Barroso, "The Tail at Scale" (CACM 2013), BigTable: a read of 1000 keys spread
# over 100 servers, hedged after 10 ms.
TAIL_AT_SCALE = "p99.9 1,800 ms -> 74 ms with 2 % more requests (hedge after 10 ms)"


class BenchError(Exception):
    """The benchmark could not run; the message says why."""


# --------------------------------------------------------------------------- scenarios


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    hedging: HedgingSettings | None
    retry: RetrySettings
    slowdown: bool = False  # the mix for --warm-s, then every call slow


def mix_scenarios() -> list[Scenario]:
    return [
        Scenario("off", None, RetrySettings()),
        Scenario("fixed 100 ms", HedgingSettings(HEDGE_DELAY_S), RetrySettings()),
        Scenario("auto", HedgingSettings(AUTO), RetrySettings()),
    ]


def slowdown_scenarios(*, quick: bool) -> list[Scenario]:
    """Five; --quick leaves out the baseline without hedging and auto with timeouts."""
    fixed, auto = HedgingSettings(HEDGE_DELAY_S), HedgingSettings(AUTO)
    every = [
        Scenario("off, slow calls succeed", None, RetrySettings(), slowdown=True),
        Scenario("fixed 100 ms, slow calls succeed", fixed, RetrySettings(), slowdown=True),
        Scenario("auto, slow calls succeed", auto, RetrySettings(), slowdown=True),
        Scenario("fixed 100 ms, calls time out at 1.5 s", fixed, TIMEOUT_RETRY, slowdown=True),
        Scenario("auto, calls time out at 1.5 s", auto, TIMEOUT_RETRY, slowdown=True),
    ]
    return [every[k] for k in (1, 2, 3)] if quick else every


@dataclass(slots=True)
class Sample:
    t: float  # seconds since the first measured publish was due
    tokens: float
    delay_ms: float | None  # the automatic hedge delay at that moment


@dataclass(slots=True)
class Run:
    scenario: Scenario
    rate: float
    publishes: int
    t0: float = 0.0
    slow_from: float = math.inf  # from then on (monotonic) every call is slow
    lag: list[float] = field(default_factory=list)  # actual start - scheduled start
    latency: list[float] = field(default_factory=list)  # of the successful publishes
    message_ids: list[str] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)  # the measured topic's server calls
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # % of one core while publishing

    @property
    def hedges(self) -> list[Call]:
        return [c for c in self.calls if (c.hedged_attempt_count or 0) > 0]

    def hedge_wins(self) -> int:
        by_id = {c.message_id: c for c in self.calls if c.message_id is not None}
        return sum(1 for m in self.message_ids if (by_id[m].hedged_attempt_count or 0) > 0)


# --------------------------------------------------------------------------- the driver


@dataclass(slots=True)
class PlanState:
    """What the server's plan reads: the seeded RNG, and when the slowdown begins."""

    rng: random.Random = field(default_factory=random.Random)
    slow_from: float = math.inf  # CLOCK_MONOTONIC: the same clock in both processes


def mix_plan(
    state: PlanState, fast_s: float, slow_s: float, slow_fraction: float
) -> Callable[[Call], Behaviour]:
    """Each call's latency, drawn per call (hedges too) from the seeded RNG."""

    def plan(call: Call) -> Behaviour:
        if not call.topic.endswith(MEASURED_SUFFIX):
            return Behaviour(fast_s)  # warm-up: no draw
        slow = state.rng.random() < slow_fraction or call.started >= state.slow_from
        return Behaviour(slow_s if slow else fast_s)

    return plan


def server_main(conn: Connection, fast_s: float, slow_s: float, slow_fraction: float) -> None:
    """The server process: a LatencyPublisher on a core of its own, driven over `conn`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal Ctrl-C: the parent stops us
    die_with_parent()
    state = PlanState()
    asyncio.run(_serve(conn, state, mix_plan(state, fast_s, slow_s, slow_fraction)))


async def _serve(conn: Connection, state: PlanState, plan: Callable[[Call], Behaviour]) -> None:
    async with LatencyPublisher(plan=plan) as server:
        conn.send(("ready", server.address))
        while True:
            cmd, arg = await asyncio.to_thread(conn.recv)
            if cmd == "stop":
                return
            if cmd == "reset":  # a new scenario: the same draws, no slowdown, no calls
                state.rng.seed(arg)
                state.slow_from = math.inf
                server.calls.clear()
                conn.send(None)
            elif cmd == "slow_from":
                state.slow_from = arg
                conn.send(None)
            elif cmd == "calls":
                # Without the payloads: 20,000 copies of 10 KB would not cross quickly.
                measured = [c for c in server.calls if c.topic.endswith(MEASURED_SUFFIX)]
                conn.send([replace(c, data=[]) for c in measured])


class ServerProcess:
    """The LatencyPublisher in a child process; stopped by its PID whatever happens."""

    def __init__(self, args: argparse.Namespace) -> None:
        ctx = multiprocessing.get_context("spawn")  # no fork after grpc has started threads
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=server_main,
            args=(child, args.fast_s, args.slow_s, args.slow_fraction),
            name="latency-publisher",
            daemon=True,
        )
        self.address = ""

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    async def __aenter__(self) -> ServerProcess:
        self._proc.start()
        try:
            ready = await self._recv(SERVER_START_S)
        except BaseException:
            self._stop()
            raise
        self.address = ready[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop()

    async def _recv(self, timeout_s: float = SERVER_ANSWER_S) -> Any:
        if not await asyncio.to_thread(self._conn.poll, timeout_s):
            code = self._proc.exitcode
            raise BenchError(f"the server process did not answer (exit code {code})")
        return self._conn.recv()

    async def command(self, cmd: str, arg: object = None) -> Any:
        """Send one command and wait for its answer."""
        self._conn.send((cmd, arg))
        return await self._recv()

    def _stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._conn.send(("stop", None))
        self._proc.join(2.0)
        if self._proc.is_alive():
            self._proc.terminate()  # SIGTERM to its own PID
            self._proc.join(2.0)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()


async def sample_tokens(bus: PubSubBus, run: Run) -> None:
    """The topic's tokens (and automatic delay) every SAMPLE_EVERY_S, until cancelled."""
    hedging = run.scenario.hedging
    bucket = bus._hedger.bucket(TOPIC)
    delay = bus._hedger.delay(TOPIC)
    if bucket is None or delay is None or hedging is None:
        return
    while True:
        auto_ms = delay.current() * 1000 if hedging.auto else None
        run.samples.append(Sample(time.monotonic() - run.t0, bucket.tokens, auto_ms))
        await asyncio.sleep(SAMPLE_EVERY_S)


async def publish_one(bus: PubSubBus, run: Run, i: int, due: float) -> None:
    started = time.monotonic()
    run.lag[i] = started - due
    try:
        message_id = await bus.publish(TOPIC, PAYLOAD, {"seq": str(i)})
    except BusUnavailable as exc:
        # "pubsub publish: 504 Deadline Exceeded" -> "504"
        kind = str(exc).removeprefix("pubsub publish: ").split(" ")[0]
        run.failures[kind] = run.failures.get(kind, 0) + 1
        return
    run.latency.append(time.monotonic() - started)
    run.message_ids.append(message_id)


async def drive(run: Run, args: argparse.Namespace, server: ServerProcess) -> None:
    """One scenario on a fresh bus (a fresh token bucket): warm-up, then the schedule."""
    sc = run.scenario
    bus = PubSubBus(PROJECT, PREFIX, endpoint=server.address, hedging=sc.hedging, retry=sc.retry)
    async with bus:
        for _ in range(WARMUP_PUBLISHES):  # connects the channel
            await bus.publish(WARMUP_TOPIC, PAYLOAD)
        await server.command("reset", args.seed)
        run.lag = [math.nan] * run.publishes
        run.t0 = time.monotonic() + 0.05
        if sc.slowdown:
            run.slow_from = run.t0 + args.warm_s
            await server.command("slow_from", run.slow_from)
        sampler = asyncio.create_task(sample_tokens(bus, run))
        tasks: set[asyncio.Task[None]] = set()
        before = cpu_snapshot(server.pid)
        try:
            await schedule(bus, run, tasks)
            run.wall_s = time.monotonic() - run.t0
            run.cpu = cpu_used(before, cpu_snapshot(server.pid), run.wall_s)
        finally:
            sampler.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(sampler, *tasks, return_exceptions=True)
    await asyncio.sleep(0.2)  # the server sees the last cancellations
    run.calls = await server.command("calls")


async def schedule(bus: PubSubBus, run: Run, tasks: set[asyncio.Task[None]]) -> None:
    """Open loop: publish i starts at t0 + i/rate in a task of its own; then wait for all."""
    i = 0
    while i < run.publishes:
        due_now = min(run.publishes, int((time.monotonic() - run.t0) * run.rate) + 1)
        for k in range(i, due_now):
            task = asyncio.create_task(publish_one(bus, run, k, run.t0 + k / run.rate))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        i = max(i, due_now)
        await asyncio.sleep(max(0.0, run.t0 + i / run.rate - time.monotonic()))
    if tasks:
        await asyncio.wait(set(tasks))


CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_snapshot(server_pid: int | None) -> tuple[float, float, float]:
    """CPU seconds so far: the whole machine (busy), this process, the server process."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(x) for x in fields]
    busy = (sum(ticks[:8]) - ticks[3] - ticks[4]) / CLK_TCK  # minus idle and iowait
    server = 0.0
    if server_pid is not None:
        stat = Path(f"/proc/{server_pid}/stat").read_text().rsplit(")", 1)[1].split()
        server = (int(stat[11]) + int(stat[12])) / CLK_TCK
    return busy, time.process_time(), server


def cpu_used(
    before: tuple[float, float, float], after: tuple[float, float, float], wall_s: float
) -> dict[str, float]:
    """% of one core used while publishing, by the publisher, the server, and the rest."""
    busy, mine, server = (b - a for a, b in zip(before, after, strict=True))
    return {
        "publisher": mine / wall_s * 100,
        "server": server / wall_s * 100,
        "others": max(0.0, busy - mine - server) / wall_s * 100,
    }


# --------------------------------------------------------------------------- figures


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of unsorted values; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def ms(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    return f"{seconds * 1000:,.1f}" if seconds < 1 else f"{seconds * 1000:,.0f}"


def mix_figures(run: Run) -> dict[str, Any]:
    publishes = run.publishes
    hedges = run.hedges
    originals = len(run.calls) - len(hedges)
    return {
        "scenario": run.scenario.name,
        "publishes": publishes,
        "ok": len(run.latency),
        "failed": run.failures,
        "p50_ms": pct(run.latency, 50) * 1000,
        "p99_ms": pct(run.latency, 99) * 1000,
        "p99_9_ms": pct(run.latency, 99.9) * 1000,
        "max_ms": max(run.latency, default=math.nan) * 1000,
        "server_calls": len(run.calls),
        "extra_rpcs_pct": (len(run.calls) / publishes - 1) * 100,
        "hedges": len(hedges),
        "retries": originals - publishes,
        "hedge_wins": run.hedge_wins(),
        "cancelled_calls": sum(c.cancelled for c in run.calls),
        "send_lag_p99_ms": pct(run.lag, 99) * 1000,
        "send_lag_max_ms": max(run.lag) * 1000,
        "cpu_pct": run.cpu,
        "wall_s": run.wall_s,
    }


def token_summary(run: Run, points: int = 9) -> str:
    """Tokens at evenly spaced moments, plus when the bucket first held one and was full."""
    s = run.samples
    hedging = run.scenario.hedging
    if not s or hedging is None:
        return "no bucket"
    step = max(1, (len(s) - 1) // (points - 1))
    picks = s[::step]
    line = " ".join(f"{x.t:.0f}s:{x.tokens:g}" for x in picks)
    first = next((x.t for x in s if x.tokens >= 1), math.nan)
    full = next((x.t for x in s if x.tokens >= hedging.max_tokens), math.nan)
    out = f"{line}  (first token {first:.1f}s, full {full:.1f}s, min after full "
    after = [x.tokens for x in s if not math.isnan(full) and x.t >= full]
    out += f"{min(after):g})" if after else "-)"
    return out


def delay_summary(run: Run, points: int = 9) -> str | None:
    s = [x for x in run.samples if x.delay_ms is not None]
    if not s:
        return None
    step = max(1, (len(s) - 1) // (points - 1))
    return " ".join(f"{x.t:.0f}s:{x.delay_ms:.0f}ms" for x in s[::step])


@dataclass(slots=True)
class Second:
    t: int
    publishes: int
    hedges: int
    tokens_end: float
    delay_ms: float | None
    failed: int = 0


def per_second(run: Run) -> list[Second]:
    """Publishes due and hedges sent in each second, until the last publish ended."""
    n = max(1, math.ceil(max(run.wall_s, run.publishes / run.rate)))
    pubs = [0] * n
    for i in range(run.publishes):
        pubs[min(n - 1, int(i / run.rate))] += 1
    hedges = [0] * n
    for call in run.hedges:
        k = int(call.started - run.t0)
        if 0 <= k < n:
            hedges[k] += 1
    rows = []
    for k in range(n):
        inside = [x for x in run.samples if k <= x.t < k + 1]
        last = inside[-1] if inside else None
        rows.append(
            Second(
                k,
                pubs[k],
                hedges[k],
                last.tokens if last else math.nan,
                last.delay_ms if last else None,
            )
        )
    return rows


# --------------------------------------------------------------------------- output


def conditions(args: argparse.Namespace) -> dict[str, Any]:
    from importlib.metadata import version

    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
        check=False,
    ).stdout.strip()  # fmt: skip
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "commit": commit or "unknown",
        "python": platform.python_version(),
        "cpu": cpu,
        "cpus": len(os.sched_getaffinity(0)),
        "loop": args.loop,
        "grpcio": version("grpcio"),
        "google-cloud-pubsub": version("google-cloud-pubsub"),
        "google-api-core": version("google-api-core"),
        "rate": args.rate,
        "publishes": args.publishes,
        "fast_ms": args.fast_s * 1000,
        "slow_ms": args.slow_s * 1000,
        "slow_fraction": args.slow_fraction,
        "seed": args.seed,
        "payload_bytes": len(PAYLOAD),
        "warm_s": args.warm_s,
        "slowdown_s": args.slowdown_s,
        "slowdown_rate": args.slowdown_rate,
    }


def print_mix(runs: list[Run]) -> list[dict[str, Any]]:
    figs = [mix_figures(r) for r in runs]
    print("\n== mixed latency: 5 % of calls slow ==")
    head = (
        f"{'hedging':<14}{'ok':>7}{'p50 ms':>9}{'p99 ms':>9}{'p99.9 ms':>10}{'max ms':>9}"
        f"{'calls':>8}{'extra':>8}{'hedges':>8}{'wins':>7}{'cancel':>8}{'lag p99':>9}"
    )
    print(head)
    for f in figs:
        print(
            f"{f['scenario']:<14}{f['ok']:>7}{f['p50_ms']:>9.1f}{f['p99_ms']:>9.1f}"
            f"{f['p99_9_ms']:>10.1f}{f['max_ms']:>9.0f}{f['server_calls']:>8}"
            f"{f['extra_rpcs_pct']:>7.2f}%{f['hedges']:>8}{f['hedge_wins']:>7}"
            f"{f['cancelled_calls']:>8}{f['send_lag_p99_ms']:>8.1f}"
        )
        if f["failed"]:
            print(f"{'':<14}failed: {f['failed']}")
    for f in figs:
        cpu = ", ".join(f"{k} {v:.0f} %" for k, v in f["cpu_pct"].items())
        print(f"CPU while publishing (% of a core), {f['scenario']}: {cpu}")
    for r in runs:
        if r.scenario.hedging is not None:
            print(f"tokens, {r.scenario.name}: {token_summary(r)}")
            d = delay_summary(r)
            if d:
                print(f"auto delay, {r.scenario.name}: {d}")
    print(f"'The Tail at Scale' (Dean & Barroso 2013): {TAIL_AT_SCALE}")
    return figs


def print_slowdown(runs: list[Run], args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    warm_s = args.warm_s
    # The steady part: from one slow call (plus a second) after the slowdown began, when
    # the first slow publishes answer, to the end of the schedule.
    steady = (math.ceil(warm_s + args.slow_s) + 1, math.floor(warm_s + args.slowdown_s))
    print(f"\n== sustained slowdown: every call slow from t = {warm_s:g} s ==")
    print(f"   (per second from t = 0 s; steady part: seconds {steady[0]} to {steady[1] - 1})")
    for r in runs:
        rows = per_second(r)
        tail = [x for x in rows if steady[0] <= x.t < steady[1]]
        pubs = sum(x.publishes for x in tail)
        hedges = sum(x.hedges for x in tail)
        late = hedges / pubs * 100 if pubs else math.nan  # nan: too short to have one
        cpu = ", ".join(f"{k} {v:.0f} %" for k, v in r.cpu.items())
        print(f"-- {r.scenario.name}: {len(r.latency)} ok, failed {r.failures or 0}; CPU {cpu}")
        print("   hedges/s:  " + " ".join(f"{x.hedges}" for x in rows))
        print("   % of rate: " + " ".join(f"{x.hedges / r.rate * 100:.0f}" for x in rows))
        print("   tokens:    " + " ".join(f"{x.tokens_end:g}" for x in rows))
        if any(x.delay_ms is not None for x in rows):
            print("   delay ms:  " + " ".join(f"{x.delay_ms or math.nan:.0f}" for x in rows))
        print(f"   steady part: {hedges} hedges / {pubs} publishes = {late:.2f} %")
        out.append(
            {
                "scenario": r.scenario.name,
                "ok": len(r.latency),
                "failed": r.failures,
                "hedges_per_s": [x.hedges for x in rows],
                "publishes_per_s": [x.publishes for x in rows],
                "tokens_per_s": [x.tokens_end for x in rows],
                "delay_ms_per_s": [x.delay_ms for x in rows],
                "late_hedge_pct": late,
                "server_calls": len(r.calls),
                "cpu_pct": r.cpu,
            }
        )
    return out


# --------------------------------------------------------------------------- the plot


def plot(path: Path, mix: list[Run], slowdown: list[Run], cond: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    (cdf, ccdf), (tokens, rate) = axes
    for r in mix:
        xs = sorted(v * 1000 for v in r.latency)
        n = len(xs)
        ys = [(k + 1) / n for k in range(n)]
        label = f"hedging {r.scenario.name}"
        cdf.plot(xs, ys, label=label, drawstyle="steps-post")
        ccdf.plot(xs, [max(1 - y, 0.5 / n) for y in ys], label=label, drawstyle="steps-post")
    for ax in (cdf, ccdf):
        ax.set_xscale("log")
        ax.set_xlabel("publish latency (ms, log scale)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="best")
    cdf.set_ylabel("fraction of publishes at most x")
    cdf.set_title("Latency CDF")
    ccdf.set_yscale("log")
    ccdf.set_ylabel("fraction of publishes slower than x (log)")
    for q in (0.01, 0.001):
        ccdf.axhline(q, color="grey", lw=0.8, ls=":")
        ccdf.annotate(f"p{100 - q * 100:g}", (ccdf.get_xlim()[0], q), fontsize=8, va="bottom")
    ccdf.set_title("Tail (complementary CDF)")
    for r in mix:
        if r.scenario.hedging is not None:
            tokens.plot([s.t for s in r.samples], [s.tokens for s in r.samples],
                        label=f"{r.scenario.name}: mixed latency")  # fmt: skip
    for r in slowdown:
        if r.scenario.hedging is None or r.scenario.retry == TIMEOUT_RETRY:
            continue
        tokens.plot([s.t for s in r.samples], [s.tokens for s in r.samples], ls="--",
                    label=f"{r.scenario.name} (slowdown)")  # fmt: skip
    tokens.set_xlabel("seconds since the first publish")
    tokens.set_ylabel("hedge tokens available")
    tokens.set_title("Token bucket (max 50, +0.1 per success, -1 per hedge)")
    tokens.grid(True, alpha=0.3)
    tokens.legend(loc="best", fontsize=8)
    for r in slowdown:
        rows = per_second(r)
        rate.plot([x.t + 0.5 for x in rows], [x.hedges / r.rate * 100 for x in rows],
                  marker=".", label=r.scenario.name)  # fmt: skip
    if slowdown:
        warm = slowdown[0].slow_from - slowdown[0].t0
        rate.axvline(warm, color="grey", ls=":", lw=1)
        rate.annotate(" every call 2 s from here", (warm, rate.get_ylim()[1] * 0.9), fontsize=8)
    rate.set_xlabel("seconds since the first publish")
    rate.set_ylabel("hedges sent per second, % of the publish rate")
    rate.set_title("Sustained slowdown: hedge rate")
    rate.grid(True, alpha=0.3)
    rate.legend(loc="best", fontsize=8)
    fig.suptitle(
        f"Hedged Pub/Sub publishing, {cond['publishes']:,} publishes at {cond['rate']:g}/s, "
        f"{cond['slow_fraction'] * 100:g} % of calls {cond['slow_ms']:g} ms, the rest "
        f"{cond['fast_ms']:g} ms (commit {cond['commit']}, {cond['date'][:10]})"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick", action="store_true",
        help="smoke run: 2,000 publishes, three 1 s + 4 s slowdowns (~45 s)",
    )  # fmt: skip
    p.add_argument("--publishes", type=int, default=20_000)
    p.add_argument("--rate", type=float, default=500.0, help="publishes per second")
    p.add_argument("--slowdown-rate", type=float, default=200.0,
                   help="publishes per second in the sustained slowdowns")  # fmt: skip
    p.add_argument("--fast-s", type=float, default=0.005)
    p.add_argument("--slow-s", type=float, default=2.0)
    p.add_argument("--slow-fraction", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--warm-s", type=float, default=5.0, help="mixed latency before a slowdown")
    p.add_argument("--slowdown-s", type=float, default=20.0, help="length of a slowdown")
    p.add_argument("--only", choices=["mix", "slowdown"], help="run one part only")
    p.add_argument("--png", type=Path, help="write the latency CDFs and token plots here")
    p.add_argument("--loop", choices=["uvloop", "asyncio"], default="asyncio",
                   help="the publisher's event loop")  # fmt: skip
    p.add_argument("--json", action="store_true", help="add one JSON line with every figure")
    args = p.parse_args(argv)
    if args.quick:
        args.publishes, args.warm_s, args.slowdown_s = 2_000, 1.0, 4.0
    if min(args.rate, args.slowdown_rate, args.publishes) <= 0:
        p.error("--rate, --slowdown-rate and --publishes must be positive")
    return args


async def bench(args: argparse.Namespace) -> tuple[list[Run], list[Run]]:
    mix: list[Run] = []
    slowdown: list[Run] = []
    async with ServerProcess(args) as server:
        if args.only in (None, "mix"):
            for sc in mix_scenarios():
                run = Run(sc, args.rate, args.publishes)
                print(f"running: mixed latency, hedging {sc.name}", file=sys.stderr, flush=True)
                await drive(run, args, server)
                mix.append(run)
        if args.only in (None, "slowdown"):
            n = round((args.warm_s + args.slowdown_s) * args.slowdown_rate)
            for sc in slowdown_scenarios(quick=args.quick):
                run = Run(sc, args.slowdown_rate, n)
                print(f"running: slowdown, {sc.name}", file=sys.stderr, flush=True)
                await drive(run, args, server)
                slowdown.append(run)
    return mix, slowdown


async def guarded(coro: Coroutine[Any, Any, T]) -> T:
    """SIGINT and SIGTERM cancel the run, so every `async with` unwinds (the server process
    is stopped by its PID); SIGINT too, as it may arrive ignored from a background shell."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await asyncio.wait_for(coro, OVERALL_TIMEOUT_S)
    except TimeoutError:
        raise BenchError(f"the run took over {OVERALL_TIMEOUT_S:.0f} s") from None
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def run_loop(coro: Coroutine[Any, Any, T], loop: str) -> T:
    """asyncio.run, on uvloop if asked (the push service runs on uvloop under uvicorn)."""
    if loop == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.png is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(
                "bench/hedging.py: --png needs matplotlib, which is not installed: "
                "`.venv/bin/pip install -e '.[dev]'` (or `.venv/bin/pip install matplotlib`), "
                "or run without --png",
                file=sys.stderr,
            )
            return 2
    cond = conditions(args)
    print("conditions: " + ", ".join(f"{k}={v}" for k, v in cond.items()))
    try:
        mix, slowdown = run_loop(guarded(bench(args)), args.loop)
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("bench/hedging.py: interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    except BenchError as exc:
        print(f"bench/hedging.py: {exc}", file=sys.stderr)
        return 1
    figures: dict[str, Any] = {"conditions": cond}
    if mix:
        figures["mix"] = print_mix(mix)
    if slowdown:
        figures["slowdown"] = print_slowdown(slowdown, args)
    if args.png is not None:
        plot(args.png, mix, slowdown, cond)
        print(f"\nplot: {args.png}")
    if args.json:
        print(json.dumps(figures, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
