"""The uid rule's refusals (`shared.uids`) in this process, for /metrics."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from shared.uids import REFUSED

__all__ = ["UidMetrics"]


class UidMetrics(Collector):
    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "imroute_uids_refused",
            "uids refused by the uid rule (a 422 naming the field, or a 401 for a token's sub)",
            REFUSED.total,
        )
