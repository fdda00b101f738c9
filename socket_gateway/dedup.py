"""A bounded, time-windowed set of recently delivered batch ids.

A bus redelivery or a hedged duplicate of a batch the gateway already wrote must not
reach clients twice; ids older than the window, or beyond the size cap, are forgotten.
"""

from __future__ import annotations

from collections import OrderedDict

from shared.clock import Clock

__all__ = ["RecentIds"]


class RecentIds:
    def __init__(self, clock: Clock, window_s: float = 600.0, max_entries: int = 200_000) -> None:
        self._clock = clock
        self._window = window_s
        self._max = max_entries
        self._seen: OrderedDict[str, float] = OrderedDict()

    def check_and_add(self, batch_id: str) -> bool:
        """True if `batch_id` was seen within the window; records it either way."""
        now = self._clock.monotonic()
        seen = self._seen
        # Insertion order is time order: expire from the old end.
        while seen:
            oldest, at = next(iter(seen.items()))
            if now - at < self._window and len(seen) < self._max:
                break
            del seen[oldest]
        if batch_id in seen:
            return True
        seen[batch_id] = now
        return False

    def __len__(self) -> int:
        return len(self._seen)
