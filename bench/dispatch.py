"""Dispatch benchmark: balancing decisions per second, per rule, for a fleet in process.

A fleet of `--gateways` (100) gateways in groups of `--per-group` (4) across `--zones`
(4) zones, with uneven connection counts, a few ineligible gateways (one stale, one
draining, one full, one with an open circuit) and a StatsRegistry that knows every
gateway. Each rule chooses for distinct uids for `--seconds` of wall time (in batches
of 1000, on the real clock, one thread); the figure is choices per second, best of
`--repeats`.

    .venv/bin/python -m bench.dispatch --quick
    .venv/bin/python -m bench.dispatch --gateways 100 --seconds 0.5 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable

from bench.harness.cli import parse_run_args
from bench.harness.stats import machine_info
from router.balancing import (
    RULE_NAMES,
    Availability,
    GatewayState,
    StatsRegistry,
    rule_for,
)
from shared.clock import SystemClock

BATCH = 1000


def build_fleet(
    clock: SystemClock, stats: StatsRegistry, gateways: int, per_group: int, zones: int
) -> list[GatewayState]:
    now = clock.now_ms()
    fleet = [
        GatewayState(
            gateway_id=f"gw{i:04d}",
            group_id=f"g{i // per_group:03d}",
            ws_url=f"ws://10.0.{i // 250}.{i % 250}:8081/ws",
            grpc_address=f"10.0.{i // 250}.{i % 250}:9081",
            connections=(i * 7919) % 40_000,
            max_connections=50_000,
            zone=f"z{i % zones}",
            heartbeat_deadline_ms=now + 3_600_000,
        )
        for i in range(gateways)
    ]
    if gateways >= 8:  # a few ineligible gateways, as a real fleet has
        fleet[1] = _replace(fleet[1], heartbeat_deadline_ms=now - 1)
        fleet[2] = _replace(fleet[2], draining=True)
        fleet[3] = _replace(fleet[3], connections=50_000)
        for _ in range(stats.settings.failure_threshold):
            ticket = stats.on_start(fleet[4].gateway_id)
            assert ticket is not None
            stats.on_failure(ticket)
    for server in fleet:
        stats.stats(server.gateway_id)
    return fleet


def _replace(server: GatewayState, **changes: object) -> GatewayState:
    import dataclasses

    return dataclasses.replace(server, **changes)  # type: ignore[arg-type]


def measure(choose: Callable[[str], object], uids: list[str], seconds: float) -> float:
    """Choices per second over at least `seconds` of wall time (whole batches)."""
    done, start = 0, time.perf_counter()
    while True:
        offset = (done // BATCH) % (len(uids) // BATCH)
        for uid in uids[offset * BATCH : (offset + 1) * BATCH]:
            choose(uid)
        done += BATCH
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return done / elapsed


def conditions(args: argparse.Namespace) -> list[str]:
    cpu = machine_info()["cpu"]
    groups = -(-args.gateways // args.per_group)
    return [
        f"python {platform.python_version()} ({platform.python_implementation()}), "
        f"{platform.system()} {platform.release()}, {cpu}, {os.cpu_count()} CPUs",
        f"fleet: {args.gateways} gateways, {groups} groups of {args.per_group}, "
        f"{args.zones} zones; 4 ineligible (stale, draining, full, open circuit)",
        f"one thread, real clock; {args.seconds:g} s per rule, best of {args.repeats}; "
        "each choice filters the whole fleet (no cached eligible list)",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--gateways", type=int, default=100)
    parser.add_argument("--per-group", type=int, default=4)
    parser.add_argument("--zones", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=0.4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="0.1 s per rule, once")
    args = parse_run_args(parser, argv, seconds=0.1, repeats=1)
    if args.gateways < 1 or args.per_group < 1 or args.zones < 1 or args.repeats < 1:
        parser.error("--gateways, --per-group, --zones and --repeats must be at least 1")

    clock = SystemClock()
    stats = StatsRegistry(clock)
    fleet = build_fleet(clock, stats, args.gateways, args.per_group, args.zones)
    available = Availability(clock, stats)
    uids = [f"user-{i}" for i in range(20 * BATCH)]

    print("dispatch decisions per second (higher is better)")
    for line in conditions(args):
        print(f"  {line}")
    for name in RULE_NAMES:
        rule = rule_for(name, available, zone="z1")

        def choose(uid: str, rule: object = rule) -> object:
            return rule.choose(fleet, uid)  # type: ignore[attr-defined]

        best = max(measure(choose, uids, args.seconds) for _ in range(args.repeats))
        print(f"  {name:<20} {best:>12,.0f} /s   {1e6 / best:7.1f} us per choice")
    return 0


if __name__ == "__main__":
    sys.exit(main())
