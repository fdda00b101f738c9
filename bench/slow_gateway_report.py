"""The slow-gateway bench's phases and figures: what each push got, per phase, and the
printed report."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.harness.report import machine_lines
from bench.harness.stats import percentile, spread

__all__ = ["GATEWAYS", "SLOW_GATEWAY", "Options", "Phase", "Push", "Totals", "report", "summarize"]

GATEWAYS = ("gw1", "gw2", "gw3", "gw4")
SLOW_GATEWAY = "gw4"
WARMUP_PUSHES = 200  # to healthy users only: a warm-up must not move the slow gateway's circuit
REDIS_SAMPLE_S = 2.0  # the MONITOR window in the middle of each phase (segment)


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

    def answer(self, resp: httpx.Response) -> None:
        if resp.status_code != 200:
            self.outcome, self.reason = "error", f"HTTP {resp.status_code}"
            return
        out = resp.json()
        if out["delivered"]:
            self.outcome = "delivered"
        elif out["failed"]:
            self.outcome = "failed"
            self.reason = "; ".join(failure_kind(e["error"]) for e in out["errors"]) or "?"
        else:
            self.outcome = "offline"

    def fail(self, exc: Exception) -> None:
        self.outcome, self.reason = "error", type(exc).__name__


def failure_kind(error: str) -> str:
    """A short name for a gateway error the push answer carried."""
    if error.startswith("circuit open"):
        return "circuit open"
    if error.startswith("DEADLINE_EXCEEDED: queued"):
        return "deadline (queued in the push service)"
    if error.startswith("DEADLINE_EXCEEDED"):
        return "deadline"
    return error[:60]


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
        answered = [(p.answered - p.sent) * 1000 for p in ps if not math.isnan(p.answered)]
        return spread(answered, count=True)

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
        "send_lag_ms": spread([(p.sent - p.due) * 1000 for p in sent], count=True),
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
        *machine_lines(cond),
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
