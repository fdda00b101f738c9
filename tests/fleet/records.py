"""The driver's records read back, and what they show: pushes accepted, received, lost,
duplicated, and how late after the heal the pushes the fault touched arrived."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.fault_clients import Got
from tests.integration.fault_ledger import Ledger, explain


@dataclass(frozen=True)
class Records:
    start: float
    ledger: Ledger
    got: dict[str, list[Got]]
    client_errors: dict[str, str]
    sdk: dict[str, int]

    @classmethod
    def read(cls, path: Path) -> Records:
        raw: dict[str, Any] = json.loads(path.read_text())
        book = raw["ledger"]
        ledger = Ledger(
            p2p=book["p2p"], fanout=book["fanout"], outcomes=Counter(book["outcomes"]),
            errors=book["errors"], sent=Counter(book["sent"]), answers=book["answers"],
            times=book["times"], retries=book["retries"],
        )  # fmt: skip
        got = {uid: [Got(**g) for g in seq] for uid, seq in raw["got"].items()}
        return cls(raw["start"], ledger, got, raw["client_errors"], raw["sdk"])


@dataclass(frozen=True)
class Figures:
    """One scenario's measure. `after_heal_s`: for each push accepted once the fault
    began, how long after the later of its acceptance and the heal it reached its
    client (the pushes the fault touched, and those after it)."""

    pushes: int  # accepted by the API (P2P answered delivered/queued, jobs 202)
    accepted: int  # (user, push) pairs the API promised
    received: int  # pushes the clients' apps were handed
    lost: int
    lost_by_kind: dict[str, int]  # p2p, mc (multicast), bc (broadcast)
    duplicated: int
    unexpected: int  # handed to a user they were not addressed to
    after_heal_s: list[float]
    failed: int  # P2P recipients answered `failed` (not promised, not counted as lost)
    retries: int  # caller retries with the same Idempotency-Key
    unanswered: int  # pushes the caller gave up on (no 2xx within its retries)
    unanswered_delivered: int  # (user, push) of those that reached an app all the same

    @property
    def p99_after_heal_s(self) -> float:
        return percentile(self.after_heal_s, 0.99)

    def line(self) -> str:
        return (
            f"pushes {self.pushes}, accepted {self.accepted}, received {self.received}, "
            f"lost {self.lost} {self.lost_by_kind or ''}, duplicated {self.duplicated}, "
            f"unexpected {self.unexpected}, "
            f"p99 after the heal {self.p99_after_heal_s:.2f}s "
            f"(max {max(self.after_heal_s, default=0.0):.2f}s over "
            f"{len(self.after_heal_s)}), failed {self.failed}, caller retries {self.retries}, "
            f"unanswered {self.unanswered} (reaching {self.unanswered_delivered} users)"
        )


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def unanswered(ledger: Ledger) -> set[str]:
    """The keys of the pushes the caller gave up on (from its error lines)."""
    return {m.group(1) for e in ledger.errors if (m := re.match(r"POST \S+ (\S+): ", e))}


def figures(rec: Records, fault_at: float, healed_at: float) -> Figures:
    ledger = rec.ledger
    gave_up = unanswered(ledger)
    lost = duplicated = unexpected = unanswered_delivered = 0
    lost_by_kind: Counter[str] = Counter()
    late: list[float] = []
    for uid, got in rec.got.items():
        expected = ledger.expected(uid)
        first: dict[str, float] = {}
        copies = Counter(g.key for g in got)
        for g in got:
            first.setdefault(g.key, g.at)
        lost += len(expected - first.keys())
        lost_by_kind.update(key.split(":", 1)[0] for key in expected - first.keys())
        duplicated += sum(n - 1 for n in copies.values())
        unexpected += len(first.keys() - expected - gave_up)
        unanswered_delivered += len(first.keys() & gave_up)
        for key in expected & first.keys():
            accepted = ledger.times[key]
            if accepted >= fault_at:
                late.append(max(0.0, first[key] - max(accepted, healed_at)))
    return Figures(
        pushes=len(ledger.times), accepted=ledger.total(),
        received=sum(map(len, rec.got.values())), lost=lost,
        lost_by_kind=dict(lost_by_kind), duplicated=duplicated, unexpected=unexpected,
        after_heal_s=late, failed=ledger.outcomes["failed"], retries=ledger.retries,
        unanswered=len(ledger.errors), unanswered_delivered=unanswered_delivered,
    )  # fmt: skip


def stories(rec: Records, path: Path) -> int:
    """Each user that lacks a push or got one twice: what it got and when (seconds
    since the load began), and the API's answers for what it lacks; written to `path`."""
    wrong = []
    for uid, got in rec.got.items():
        keys = [g.key for g in got]
        if rec.ledger.expected(uid) - set(keys) or len(keys) != len(set(keys)):
            wrong.append(explain(uid, got, rec.ledger, rec.start))
    path.write_text("\n\n".join(wrong))
    return len(wrong)
