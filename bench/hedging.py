"""Hedged publishing benchmark: the tail latency hedging buys, and what it costs.

The real path: `router.bus.pubsub.PubSubBus` -> google-cloud-pubsub's PublisherAsyncClient
-> real gRPC over loopback -> `router.testing.pubsub.LatencyPublisher`, a Publisher
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

The publisher runs in this process on one event loop, the server in a child process of
its own; the server, the bus and every task are stopped on exit, Ctrl-C, SIGTERM and
errors. From the repository root:

    .venv/bin/python -m bench.hedging --quick
    .venv/bin/python -m bench.hedging --png docs/assets/hedging_cdf.png
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.cli import parse_run_args
from bench.harness.link import ChildLink, emit, stdin_commands
from bench.harness.stack import BenchError, Interrupted, bench_argv, run_async
from bench.harness.stats import busy_seconds, cpu_seconds
from bench.hedging_report import (
    PAYLOAD_BYTES,
    TIMEOUT_RETRY,
    Run,
    Sample,
    Scenario,
    conditions,
    plot,
    print_mix,
    print_slowdown,
)
from router.bus import BROADCAST, group_topic
from router.bus.pubsub import PubSubBus
from router.hedging import AUTO, HedgingSettings, RetrySettings
from router.processes.supervisor import Supervisor
from router.testing.pubsub import Behaviour, Call, LatencyPublisher
from shared.errors import BusUnavailable

PROJECT = "imroute-bench"
PREFIX = "bench-hedging:"
TOPIC = BROADCAST
MEASURED_SUFFIX = f"~{TOPIC}"  # the end of the measured topic's Pub/Sub path
WARMUP_TOPIC = group_topic("warmup")  # a bucket of its own: the measured one starts empty
WARMUP_PUBLISHES = 50
PAYLOAD = bytes(PAYLOAD_BYTES)
SAMPLE_EVERY_S = 0.1
OVERALL_TIMEOUT_S = 900.0
SERVER_START_S = 30.0
SERVER_ANSWER_S = 30.0
HEDGE_DELAY_S = 0.1


# --------------------------------------------------------------------------- scenarios


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


def server_main(spec: dict[str, float]) -> int:
    """The server process: a LatencyPublisher on a core of its own, driven over stdin."""
    state = PlanState()
    plan = mix_plan(state, spec["fast_s"], spec["slow_s"], spec["slow_fraction"])
    asyncio.run(_serve(state, plan))
    return 0


async def _serve(state: PlanState, plan: Callable[[Call], Behaviour]) -> None:
    async with LatencyPublisher(plan=plan) as server:
        emit(event="ready", address=server.address)
        async for cmd in stdin_commands():
            if cmd["cmd"] == "stop":
                return
            if cmd["cmd"] == "reset":  # a new scenario: the same draws, no slowdown, no calls
                state.rng.seed(cmd["seed"])
                state.slow_from = math.inf
                server.calls.clear()
                emit(event="reset")
            elif cmd["cmd"] == "slow_from":
                state.slow_from = cmd["t"]
                emit(event="slow_from")
            elif cmd["cmd"] == "calls":
                # Without the payloads: 20,000 copies of 10 KB would not cross quickly.
                measured = [c for c in server.calls if c.topic.endswith(MEASURED_SUFFIX)]
                emit(event="calls", calls=[dataclasses.asdict(c) | {"data": []} for c in measured])


class ServerProcess:
    """The LatencyPublisher in a child process; stopped by its PID whatever happens."""

    def __init__(self, args: argparse.Namespace) -> None:
        spec = {"fast_s": args.fast_s, "slow_s": args.slow_s, "slow_fraction": args.slow_fraction}
        self._argv = bench_argv("bench.hedging", "--serve", json.dumps(spec))
        self._children = Supervisor()
        self._link: ChildLink | None = None
        self.address = ""
        self.pid: int | None = None

    async def __aenter__(self) -> ServerProcess:
        # Its own session: a terminal Ctrl-C reaches only us, and we stop the server.
        child = self._children.start(
            "latency-publisher", self._argv, stdin="pipe", stdout="pipe", new_session=True
        )
        self.pid = child.pid
        try:
            self._link = await ChildLink(child).open()
            self.address = (await self._link.expect("ready", SERVER_START_S))["address"]
        except BaseException:
            self._stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop()

    async def command(self, cmd: str, **args: Any) -> dict[str, Any]:
        """Send one command and wait for its answer."""
        assert self._link is not None
        return await self._link.ask(cmd, SERVER_ANSWER_S, cmd=cmd, **args)

    def _stop(self) -> None:
        if self._link is not None:
            with contextlib.suppress(BenchError):
                self._link.send(cmd="stop")
            self._link.close()
        self._children.stop_all(grace_s=2.0)


async def sample_tokens(bus: PubSubBus, run: Run) -> None:
    """The topic's tokens (and automatic delay) every SAMPLE_EVERY_S, until cancelled."""
    hedging = run.scenario.hedging
    bucket = bus.hedger.bucket(TOPIC)
    delay = bus.hedger.delay(TOPIC)
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
        await server.command("reset", seed=args.seed)
        run.lag = [math.nan] * run.publishes
        run.t0 = time.monotonic() + 0.05
        if sc.slowdown:
            run.slow_from = run.t0 + args.warm_s
            await server.command("slow_from", t=run.slow_from)
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
    run.calls = [Call(**c) for c in (await server.command("calls"))["calls"]]


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


def cpu_snapshot(server_pid: int | None) -> tuple[float, float, float]:
    """CPU seconds so far: the whole machine (busy), this process, the server process."""
    server = (cpu_seconds(server_pid) or 0.0) if server_pid is not None else 0.0
    return busy_seconds(), time.process_time(), server


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
    p.add_argument("--serve", help=argparse.SUPPRESS)
    args = parse_run_args(p, argv, publishes=2_000, warm_s=1.0, slowdown_s=4.0)
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


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        return server_main(json.loads(args.serve))
    if args.png is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(
                "bench.hedging: --png needs matplotlib, which is not installed: "
                "`.venv/bin/pip install -e '.[dev]'` (or `.venv/bin/pip install matplotlib`), "
                "or run without --png",
                file=sys.stderr,
            )
            return 2
    cond = conditions(args)
    print("conditions: " + ", ".join(f"{k}={v}" for k, v in cond.items()))
    try:
        mix, slowdown = run_async(lambda: bench(args), OVERALL_TIMEOUT_S, loop=args.loop)
    except (KeyboardInterrupt, Interrupted):
        print("bench.hedging: interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    except BenchError as exc:
        print(f"bench.hedging: {exc}", file=sys.stderr)
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
