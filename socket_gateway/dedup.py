"""Bounded, time-windowed memories of recently delivered batches, one per way in.

A bus redelivery, a hedged duplicate or a retried gRPC call of a batch the gateway already
wrote must not reach clients twice. Bus batches and P2P batches are remembered apart, so
a burst of one cannot push the other's ids out early: at 5k P2P batches/s a shared set
of 200k ids covered 40 s instead of 10 minutes, and a bus redelivery after that reached a
client twice. Each memory is bounded in count and in bytes; an id forgotten before its
window ran out is counted (`evicted_early`), since a duplicate of it would get through.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from shared.clock import Clock

__all__ = ["RecentIds", "RecentReplies"]

# What an entry costs besides its id and bitmap: the tuple, the dict slot (roughly).
ENTRY_OVERHEAD = 200
# How long past its expiry a P2P batch's answer is kept: a retry of it may still be on
# its way, and must get the first answer (delivered), not "expired".
REPLY_GRACE_S = 5.0


class RecentIds:
    """Bus batch ids seen within `window_s` (the bus's redelivery horizon: Pub/Sub's
    longest ack deadline is 600 s), at most `max_entries` and about `max_bytes`."""

    def __init__(
        self,
        clock: Clock,
        window_s: float = 600.0,
        max_entries: int = 200_000,
        max_bytes: int = 64 << 20,
    ) -> None:
        self._clock = clock
        self._window = window_s
        self._max = max_entries
        self._max_bytes = max_bytes
        self._bytes = 0
        self._seen: OrderedDict[str, float] = OrderedDict()
        self.evicted_early = 0  # ids forgotten inside their window, for the caps

    def check_and_add(self, batch_id: str) -> bool:
        """True if `batch_id` was seen within the window; records it either way."""
        now = self._clock.monotonic()
        seen = self._seen
        size = len(batch_id) + ENTRY_OVERHEAD
        # Insertion order is time order: expire from the old end.
        while seen:
            oldest, at = next(iter(seen.items()))
            young = now - at < self._window
            if young and len(seen) < self._max and self._bytes + size <= self._max_bytes:
                break
            del seen[oldest]
            self._bytes -= len(oldest) + ENTRY_OVERHEAD
            self.evicted_early += young
        if batch_id in seen:
            return True
        seen[batch_id] = now
        self._bytes += size
        return False

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._seen)


class RecentReplies:
    """What recent P2P batches delivered, by batch id: the P2P dedupe, and the answer
    to a retried call.

    A router that lost the answer to a Deliver call resends the same batch; the gateway
    drops it as a duplicate and answers with what the first attempt delivered, so the
    push is reported delivered once, not offline or failed. A retry resends the same
    uids in the same order, so a bitmap of the delivered positions is enough (125 bytes
    per 1000 uids; empty when every uid was delivered).

    Every P2P batch expires by the end of the router's call (its `expires_ms`), and an
    expired batch is never written, so an entry is needed only until then, plus
    REPLY_GRACE_S for a retry still in flight: at 10k batches/s and the default 2 s
    deadline that is about 70k entries, well inside the caps. A batch without an expiry
    (a router older than this rule) is kept for `window_s`.
    """

    def __init__(
        self,
        clock: Clock,
        window_s: float = 60.0,
        max_entries: int = 200_000,
        max_bytes: int = 64 << 20,
    ) -> None:
        self._clock = clock
        self._window = window_s
        self._max = max_entries
        self._max_bytes = max_bytes
        self._bytes = 0
        # batch id -> (keep until, on the monotonic clock; delivered bitmap)
        self._replies: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self.evicted_early = 0  # answers forgotten before their batch expired, for the caps

    def put(
        self,
        batch_id: str,
        uids: Sequence[str],
        delivered: Sequence[str],
        expires_in_s: float | None = None,
    ) -> None:
        """Remember the answer; `expires_in_s`: how long until the batch expires."""
        mask = b"" if len(delivered) == len(uids) else _mask(uids, delivered)
        now = self._clock.monotonic()
        keep = self._window if expires_in_s is None else min(self._window, expires_in_s)
        replies = self._replies
        size = len(batch_id) + len(mask) + ENTRY_OVERHEAD
        # Roughly in time order (expiries follow the calls): expire from the old end.
        while replies:
            oldest, (until, old) = next(iter(replies.items()))
            young = now < until
            fits = len(replies) < self._max and self._bytes + size <= self._max_bytes
            if young and fits:
                break
            del replies[oldest]
            self._bytes -= len(oldest) + len(old) + ENTRY_OVERHEAD
            self.evicted_early += young
        old_entry = replies.pop(batch_id, None)
        if old_entry is not None:
            self._bytes -= len(batch_id) + len(old_entry[1]) + ENTRY_OVERHEAD
        replies[batch_id] = (now + max(keep, 0.0) + REPLY_GRACE_S, mask)
        self._bytes += size

    def seen(self, batch_id: str) -> bool:
        entry = self._replies.get(batch_id)
        return entry is not None and self._clock.monotonic() < entry[0]

    def get(self, batch_id: str, uids: Sequence[str]) -> tuple[list[str], list[str]] | None:
        """(delivered, missing) of the first attempt of `batch_id`, or None."""
        entry = self._replies.get(batch_id)
        if entry is None or self._clock.monotonic() >= entry[0]:
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
