"""A bounded, time-windowed set of recently delivered batch ids.

A bus redelivery, a hedged duplicate or a retried gRPC call of a batch the gateway already
wrote must not reach clients twice; ids older than the window, or beyond the size cap, are
forgotten.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

from shared.clock import Clock

__all__ = ["RecentIds", "RecentReplies"]

V = TypeVar("V")


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


class RecentReplies(Generic[V]):
    """The answers to recent P2P batches, by batch id, for a retried call to get.

    A router that lost the answer to a Deliver call resends the same batch; the gateway
    drops it as a duplicate and answers with what the first attempt delivered, so the
    push is reported delivered once, not offline. Capped in time and size: a retry comes
    within seconds, and P2P replies are small.
    """

    def __init__(self, clock: Clock, window_s: float = 60.0, max_entries: int = 20_000) -> None:
        self._clock = clock
        self._window = window_s
        self._max = max_entries
        self._replies: OrderedDict[str, tuple[float, V]] = OrderedDict()

    def put(self, batch_id: str, reply: V) -> None:
        now = self._clock.monotonic()
        replies = self._replies
        while replies:
            oldest, (at, _) = next(iter(replies.items()))
            if now - at < self._window and len(replies) < self._max:
                break
            del replies[oldest]
        replies[batch_id] = (now, reply)

    def get(self, batch_id: str) -> V | None:
        entry = self._replies.get(batch_id)
        if entry is None or self._clock.monotonic() - entry[0] >= self._window:
            return None
        return entry[1]

    def __len__(self) -> int:
        return len(self._replies)
