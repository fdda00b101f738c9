"""A bounded, time-windowed set of recently delivered batch ids.

A bus redelivery, a hedged duplicate or a retried gRPC call of a batch the gateway already
wrote must not reach clients twice; ids older than the window, or beyond the size cap, are
forgotten.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from shared.clock import Clock

__all__ = ["RecentIds", "RecentReplies"]

# What an entry costs besides its bitmap: the key, the tuple, the dict slot (roughly).
ENTRY_OVERHEAD = 300


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


class RecentReplies:
    """What recent P2P batches delivered, by batch id, for a retried call to be answered.

    A router that lost the answer to a Deliver call resends the same batch; the gateway
    drops it as a duplicate and answers with what the first attempt delivered, so the
    push is reported delivered once, not offline or failed. A retry resends the same
    uids in the same order, so a bitmap of the delivered positions is enough (125 bytes
    per 1000 uids; empty when every uid was delivered). Capped in time, entries and
    bytes: a retry comes within seconds.
    """

    def __init__(
        self,
        clock: Clock,
        window_s: float = 60.0,
        max_entries: int = 50_000,
        max_bytes: int = 16 << 20,
    ) -> None:
        self._clock = clock
        self._window = window_s
        self._max = max_entries
        self._max_bytes = max_bytes
        self._bytes = 0
        self._replies: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    def put(self, batch_id: str, uids: Sequence[str], delivered: Sequence[str]) -> None:
        mask = b"" if len(delivered) == len(uids) else _mask(uids, delivered)
        now = self._clock.monotonic()
        replies = self._replies
        size = len(mask) + ENTRY_OVERHEAD
        while replies:
            oldest, (at, old) = next(iter(replies.items()))
            fits = len(replies) < self._max and self._bytes + size <= self._max_bytes
            if now - at < self._window and fits:
                break
            del replies[oldest]
            self._bytes -= len(old) + ENTRY_OVERHEAD
        old_entry = replies.pop(batch_id, None)
        if old_entry is not None:
            self._bytes -= len(old_entry[1]) + ENTRY_OVERHEAD
        replies[batch_id] = (now, mask)
        self._bytes += size

    def get(self, batch_id: str, uids: Sequence[str]) -> tuple[list[str], list[str]] | None:
        """(delivered, missing) of the first attempt of `batch_id`, or None."""
        entry = self._replies.get(batch_id)
        if entry is None or self._clock.monotonic() - entry[0] >= self._window:
            return None
        mask = entry[1]
        if not mask:
            return list(uids), []
        if len(mask) != (len(uids) + 7) // 8:
            return None  # not the same batch after all
        delivered: list[str] = []
        missing: list[str] = []
        for i, uid in enumerate(uids):
            (delivered if mask[i >> 3] >> (i & 7) & 1 else missing).append(uid)
        return delivered, missing

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._replies)


def _mask(uids: Sequence[str], delivered: Sequence[str]) -> bytes:
    wrote = set(delivered)
    mask = bytearray((len(uids) + 7) // 8)
    for i, uid in enumerate(uids):
        if uid in wrote:
            mask[i >> 3] |= 1 << (i & 7)
    return bytes(mask)
