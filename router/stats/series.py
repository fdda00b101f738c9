"""What the dashboard draws (pure): per interval, each count as a rate per second and
the delivery latency's p50 and p99."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from router.stats.latency import PREFIX, percentile

__all__ = ["RATES", "points", "totals"]

# The counts drawn as rates: the push service's, then the gateways'.
RATES = (
    "p2p",  # POST /v1/push calls pushed
    "batch",  # messages pushed by POST /v1/push/batch
    "broadcast",  # broadcast jobs started
    "multicast",  # multicast jobs started
    "queued",  # P2P recipients left in their inbox (no connection reached)
    "publishes",  # bus publish attempts (hedges included)
    "hedges",  # hedged publish attempts
    "hedge_wins",  # publishes a hedge won
    "delivered",  # recipients a gateway wrote a push to (every mode)
    "acked",  # pushes devices acked
)


def _is_latency(name: str) -> bool:
    return name.startswith(PREFIX) and name[len(PREFIX) :].isdigit()


def points(buckets: Sequence[tuple[int, dict[str, int]]], bucket_ms: int) -> list[dict[str, Any]]:
    """One point per interval: `t` (its start, ms), each of RATES per second, `p50` and
    `p99` in ms (None: nothing was written then)."""
    per_s = 1000 / bucket_ms
    out = []
    for start, counts in buckets:
        point: dict[str, Any] = {"t": start}
        for name in RATES:
            point[name] = round(counts.get(name, 0) * per_s, 2)
        point["p50"] = percentile(counts, 0.50)
        point["p99"] = percentile(counts, 0.99)
        out.append(point)
    return out


def totals(buckets: Sequence[tuple[int, dict[str, int]]]) -> dict[str, int]:
    """Every count summed over the intervals (latency buckets left out)."""
    summed: dict[str, int] = {}
    for _, counts in buckets:
        for name, n in counts.items():
            if not _is_latency(name):
                summed[name] = summed.get(name, 0) + n
    return summed
