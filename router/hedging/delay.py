"""The hedge delay: fixed, or "auto", a rolling p95 of recent attempt latencies (pure).

An attempt counts when it succeeded, or when it lost to another and was cancelled
(then for as long as it was out); failed attempts do not, so fast errors cannot pull
the delay down while the service fails.

Dean and Barroso ("The Tail at Scale", 2013) hedge after the 95th-percentile expected
latency, which keeps the extra load near 5 %. Until `min_samples` publishes have been
seen, the automatic delay is Google's default of 1 s. It is always clamped to the
allowed 100 ms to 10 s, and kept below `ceiling_s` (the retry settings' timeouts).
"""

from __future__ import annotations

import bisect
from collections import deque

from router.hedging.settings import DELAY_MAX_S, DELAY_MIN_S, HedgingSettings

__all__ = ["HedgeDelay"]

DEFAULT_S = 1.0
WINDOW = 1000
MIN_SAMPLES = 50
PERCENTILE = 0.95


class HedgeDelay:
    def __init__(
        self,
        settings: HedgingSettings,
        ceiling_s: float,
        *,
        window: int = WINDOW,
        min_samples: int = MIN_SAMPLES,
    ) -> None:
        self._fixed = None if settings.auto else float(settings.hedge_delay)
        # Strictly below the ceiling: a hedge must be able to fire before a timeout.
        self._max = min(DELAY_MAX_S, ceiling_s * 0.999)
        self._window: deque[float] = deque(maxlen=window)
        self._sorted: list[float] = []
        self._min_samples = min_samples

    def record(self, latency_s: float) -> None:
        """How long one RPC attempt was out (not the publish: a hedged publish's
        latency is the delay plus the hedge's, and would teach the delay itself)."""
        if self._fixed is not None:
            return
        if len(self._window) == self._window.maxlen:
            oldest = self._window[0]
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
        self._window.append(latency_s)
        bisect.insort(self._sorted, latency_s)

    def current(self) -> float:
        """The delay to wait now before the next hedge."""
        if self._fixed is not None:
            return self._fixed
        if len(self._sorted) < self._min_samples:
            target = DEFAULT_S
        else:
            target = self._sorted[min(len(self._sorted) - 1, int(PERCENTILE * len(self._sorted)))]
        return max(DELAY_MIN_S, min(self._max, target))
