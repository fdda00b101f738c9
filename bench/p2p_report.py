"""bench.p2p's figures: each push's record, the run's summary and its printed report."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import httpx

from bench.harness.redis_info import RedisCounters
from bench.harness.report import machine_lines
from bench.harness.stats import spread

__all__ = ["Options", "PushRecord", "report", "summarize"]


@dataclass
class PushRecord:
    due: float = math.nan
    sent: float = math.nan
    answered: float = math.nan
    status: int = 0
    delivered: bool = False
    failed: bool = False
    msg_id: str = ""
    push_id: str = ""
    error: str = ""
    acked: int = -1  # with wait_ack_ms: how many recipients the answer lists as acked
    unacked: int = -1

    def answer(self, resp: httpx.Response) -> None:
        self.status = resp.status_code
        if resp.status_code == 200:
            out = resp.json()
            self.msg_id = out["msg_id"]
            self.push_id = out["push_id"]
            self.delivered = bool(out["delivered"])
            self.failed = bool(out["failed"])
            if out.get("acked") is not None:
                self.acked = len(out["acked"])
                self.unacked = len(out["unacked"])
        else:
            self.error = f"HTTP {resp.status_code}"

    def fail(self, exc: Exception) -> None:
        self.error = type(exc).__name__


@dataclass
class Options:
    clients: int
    rate: float
    duration: float
    concurrency: int
    seed: int
    json_out: bool
    store: bool = True
    internal: str = "token"
    ack: bool = False  # every client acks every push as it arrives
    wait_ack_ms: int | None = None
    receipts: bool = True  # False: IMROUTE_RECEIPTS_TTL_S=0


def summarize(
    opts: Options,
    records: list[PushRecord],
    dump: dict[str, Any],
    connected: int,
    ready: dict[str, Any],
    wall_s: float,
    cpu_before: dict[str, float],
    cpu_after: dict[str, float],
    redis_delta: RedisCounters | None = None,
    receipts_sampled: dict[str, int] | None = None,
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
    waited = [r for r in ok if r.acked >= 0]

    return {
        "clients": connected,
        "clients_failed": len(ready["failed"]),
        "connect_s": ready["seconds"],
        "target_rate": opts.rate,
        "duration_s": opts.duration,
        "concurrency": opts.concurrency,
        "ack": opts.ack,
        "wait_ack_ms": opts.wait_ack_ms,
        "receipts": opts.receipts,
        "scheduled": len(records),
        "pushes": sum(1 for r in records if not math.isnan(r.sent)),
        "ok": len(ok),
        "delivered": sum(1 for r in records if r.delivered),
        "achieved_rate": len(ok) / span if span and span > 0 else math.nan,
        "e2e_ms": spread(e2e),
        "rest_ms": spread(rest),
        "send_lag_ms": spread(lag),
        "received": len(e2e),
        "lost": lost,
        "msg_id_mismatch": mismatched,
        "unexpected": unexpected,
        "duplicates": dump["duplicates"],
        "acks_sent": dump.get("acks_sent", 0),
        "waited": len(waited),
        "waited_all_acked": sum(1 for r in waited if r.unacked == 0),
        "receipts_sampled": receipts_sampled or {},
        "closed_clients": dump["closed"],
        "open_clients": dump["open"],
        "try_again": dump["try_again"],
        "bad_frames": dump["bad"],
        "errors": errors,
        "cpu_pct": cpu,
        "cpu_ms_per_push": {
            name: 1000 * (cpu_after[name] - cpu_before[name]) / len(ok) for name in cpu if ok
        },
        "redis_per_push": redis_delta.per(len(ok)) if redis_delta is not None else {},
    }


def _redis_line(per: dict[str, Any]) -> str:
    if not per:
        return "  redis/push  (no INFO from Redis)"
    calls: dict[str, float] = per["calls"]
    top = ", ".join(f"{name} {n:.2f}" for name, n in list(calls.items())[:8])
    return (
        f"  redis/push  cpu {per['cpu_ms']:.3f} ms (INFO), {per['commands']:.2f} commands,"
        f" {per['reads']:.2f} socket reads; calls: {top}"
    )


def report(result: dict[str, Any], cond: dict[str, str]) -> None:
    def ms(d: dict[str, float]) -> str:
        return "  ".join(f"{k} {v:7.2f}" for k, v in d.items()) + " ms"

    r = result
    cpu = ", ".join(f"{k} {v:.0f}%" for k, v in r["cpu_pct"].items())
    per = ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_ms_per_push"].items())
    wait = "" if r["wait_ack_ms"] is None else f", wait_ack_ms {r['wait_ack_ms']}"
    sampled = r["receipts_sampled"]
    lines = [
        "imroute P2P push benchmark (REST -> push service -> gRPC -> gateway -> WebSocket)",
        "conditions:",
        *machine_lines(cond),
        f"  python      {cond['python']}  client/loadgen loop={cond['loop']}",
        f"  stack       push service (uvicorn, 1 process) + gw1/g1 + gw2/g2; redis {cond['redis']}"
        f"; store {cond.get('store', 'on')}; internal calls {cond.get('internal', 'none')}"
        f"; receipts {'on' if r['receipts'] else 'off'}",
        f"  clients     {r['clients']} connected ({r['clients_failed']} failed) in 1 client"
        f" process, connected in {r['connect_s']:.1f}s; acks {'on' if r['ack'] else 'off'}",
        f"  load        target {r['target_rate']:g} pushes/s for {r['duration_s']:g}s, open loop,"
        f" concurrency {r['concurrency']}, 1 random uid per push (httpx, keep-alive){wait}",
        "results:",
        f"  pushes      {r['scheduled']} scheduled, {r['pushes']} sent, {r['ok']} HTTP 200,"
        f" {r['delivered']} delivered",
        f"  achieved    {r['achieved_rate']:.0f} pushes/s (target {r['target_rate']:g})",
        f"  end-to-end  {ms(r['e2e_ms'])}  (n={r['received']})",
        f"  REST call   {ms(r['rest_ms'])}",
        f"  send lag    {ms(r['send_lag_ms'])}  (actual send - scheduled send)",
        f"  frames      lost {r['lost']}, msg_id mismatch {r['msg_id_mismatch']}, unexpected"
        f" {r['unexpected']}, duplicates {r['duplicates']}, bad {r['bad_frames']}",
        f"  acks        {r['acks_sent']} ack frames sent (warm-up included)"
        + (f"; {r['waited_all_acked']} of {r['waited']} answers all acked" if wait else "")
        + (
            f"; receipts of {sampled['pushes']} delivered pushes read: {sampled['acked']}"
            f" acked, {sampled['delivered']} delivered"
            if sampled
            else ""
        ),
        f"  clients     {r['open_clients']} open at the end, {r['closed_clients']} closed;"
        f" {r['try_again']} closes with 1013 (try again) while connecting, reconnected",
        f"  errors      {r['errors'] or 'none'}",
        f"  cpu         {cpu}  (% of one core during the load phase; others = processes"
        " not started by this run)",
        f"  cpu / push  {per}  (ms of CPU per answered push)",
        _redis_line(r["redis_per_push"]),
    ]
    print("\n".join(lines), flush=True)
