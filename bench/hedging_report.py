"""The hedging bench's figures: what a run recorded, the tables it prints, the plot."""

from __future__ import annotations

import argparse
import math
import os
import platform
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bench.harness.report import git_commit
from bench.harness.stats import machine_info, percentile
from router.hedging import HedgingSettings, RetrySettings
from router.testing.pubsub import Call

__all__ = [
    "TIMEOUT_RETRY",
    "Run",
    "Sample",
    "Scenario",
    "conditions",
    "plot",
    "print_mix",
    "print_slowdown",
]

PAYLOAD_BYTES = 10_000  # about one 1000-uid batch
# Calls that time out: the per-attempt timeout is below the slow calls' 2 s, and the
# total timeout leaves no room for a retry, so every server call is an original or a hedge.
TIMEOUT_RETRY = RetrySettings(initial_rpc_timeout_s=1.5, max_rpc_timeout_s=1.5, total_timeout_s=1.5)
# Dean & Barroso, "The Tail at Scale" (CACM 2013), BigTable: a read of 1000 keys spread
# over 100 servers, hedged after 10 ms.
TAIL_AT_SCALE = "p99.9 1,800 ms -> 74 ms with 2 % more requests (hedge after 10 ms)"


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    hedging: HedgingSettings | None
    retry: RetrySettings
    slowdown: bool = False  # the mix for --warm-s, then every call slow


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


def mix_figures(run: Run) -> dict[str, Any]:
    publishes = run.publishes
    hedges = run.hedges
    originals = len(run.calls) - len(hedges)
    latency = sorted(run.latency)
    return {
        "scenario": run.scenario.name,
        "publishes": publishes,
        "ok": len(run.latency),
        "failed": run.failures,
        "p50_ms": percentile(latency, 50) * 1000,
        "p99_ms": percentile(latency, 99) * 1000,
        "p99_9_ms": percentile(latency, 99.9) * 1000,
        "max_ms": max(run.latency, default=math.nan) * 1000,
        "server_calls": len(run.calls),
        "extra_rpcs_pct": (len(run.calls) / publishes - 1) * 100,
        "hedges": len(hedges),
        "retries": originals - publishes,
        "hedge_wins": run.hedge_wins(),
        "cancelled_calls": sum(c.cancelled for c in run.calls),
        "send_lag_p99_ms": percentile(sorted(run.lag), 99) * 1000,
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


def conditions(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "commit": git_commit(),
        "python": platform.python_version(),
        "cpu": machine_info()["cpu"],
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
        "payload_bytes": PAYLOAD_BYTES,
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
