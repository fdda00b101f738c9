"""Delivery latency as a histogram with logarithmic buckets (pure): a few bytes per
interval whatever the traffic, summable across processes, read as percentiles."""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["LatencyHistogram", "bucket_of", "field_of", "percentile", "upper_ms"]

# Four buckets per doubling: a percentile is read to within about 19 %.
PER_DOUBLING = 4
MAX_BUCKET = 80  # 2**20 ms, about 17 minutes: everything slower lands here
PREFIX = "l"  # a histogram field is "l<bucket>"


def bucket_of(ms: float) -> int:
    if ms <= 0:
        return 0
    return min(int(math.log2(ms + 1) * PER_DOUBLING), MAX_BUCKET)


def upper_ms(bucket: int) -> float:
    """The largest latency in `bucket` (what a percentile falling in it reads)."""
    return float(2 ** ((bucket + 1) / PER_DOUBLING) - 1)


def field_of(bucket: int) -> str:
    return f"{PREFIX}{bucket}"


class LatencyHistogram:
    """Counts per bucket since the last `take`."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}

    def add(self, ms: float, n: int = 1) -> None:
        b = bucket_of(ms)
        self._counts[b] = self._counts.get(b, 0) + n

    def take(self) -> dict[str, int]:
        """The counts as store fields ("l<bucket>"), and start again."""
        counts, self._counts = self._counts, {}
        return {field_of(b): n for b, n in counts.items()}


def percentile(fields: Mapping[str, int], q: float) -> float | None:
    """The `q` (0-1) percentile of the latencies in `fields` (store fields, any others
    ignored), as its bucket's upper bound; None when there are none."""
    buckets = sorted(
        (int(k[len(PREFIX) :]), n)
        for k, n in fields.items()
        if k.startswith(PREFIX) and k[len(PREFIX) :].isdigit()
    )
    total = sum(n for _, n in buckets)
    if not total:
        return None
    rank = q * total
    seen = 0
    for b, n in buckets:
        seen += n
        if seen >= rank:
            return upper_ms(b)
    return upper_ms(buckets[-1][0])
