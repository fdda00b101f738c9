"""Bounded, time-windowed memories of recently delivered batches, one per way in.

A bus redelivery, a hedged duplicate or a retried gRPC call of a batch the gateway already
wrote must not reach clients twice. Bus batches and P2P batches are remembered apart, so
a burst of one cannot push the other's ids out early: at 5k P2P batches/s a shared set
of 200k ids covered 40 s instead of 10 minutes, and a bus redelivery after that reached a
client twice. Each memory is bounded in count and in bytes; an id forgotten before its
window ran out is counted (`evicted_early`), since a duplicate of it would get through.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from shared.clock import Clock
from shared.expiring import ExpiringMap

__all__ = ["RecentIds", "RecentReplies"]

# What an entry costs besides its id and bitmap: the tuple, the dict slot (roughly).
ENTRY_OVERHEAD = 200
# How long past its expiry a P2P batch's answer is kept: a retry of it may still be on
# its way, and must get the first answer (delivered), not "expired".
REPLY_GRACE_S = 5.0


class _Memory:
    """Batch ids, each with a few bytes (an answer's bitmap, or none), kept for
    `window_s` at most (the class's WINDOW_S unless given), within `max_entries` and
    about `max_bytes`."""

    WINDOW_S: ClassVar[float]

    def __init__(
        self,
        clock: Clock,
        window_s: float | None = None,
        max_entries: int = 200_000,
        max_bytes: int = 64 << 20,
    ) -> None:
        self._window = self.WINDOW_S if window_s is None else window_s
        self._kept: ExpiringMap[str, bytes] = ExpiringMap(
            clock.monotonic, _entry_size, max_entries, max_bytes
        )

    @property
    def evicted_early(self) -> int:
        """Entries forgotten before their time was up, for the caps."""
        return self._kept.evicted_early

    @property
    def bytes(self) -> int:
        return self._kept.bytes

    def __len__(self) -> int:
        return len(self._kept)


def _entry_size(batch_id: str, kept: bytes) -> int:
    return len(batch_id) + len(kept) + ENTRY_OVERHEAD


class RecentIds(_Memory):
    """Bus batch ids seen within `window_s` (the bus's redelivery horizon: Pub/Sub's
    longest ack deadline is 600 s), at most `max_entries` and about `max_bytes`."""

    # Kept for the same window each, so insertion order is expiry order.
    WINDOW_S = 600.0

    def check_and_add(self, batch_id: str) -> bool:
        """True if `batch_id` was seen within the window; records it either way."""
        return self._kept.add(batch_id, b"", self._window)


class RecentReplies(_Memory):
    """What recent P2P batches delivered, by batch id: the P2P dedupe, and the answer
    to a retried call.

    A router that lost the answer to a delivery call resends the same batch; the gateway
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

    # batch id -> delivered bitmap; roughly in expiry order (expiries follow the calls)
    WINDOW_S = 60.0

    def put(
        self,
        batch_id: str,
        uids: Sequence[str],
        delivered: Sequence[str],
        expires_in_s: float | None = None,
    ) -> None:
        """Remember the answer; `expires_in_s`: how long until the batch expires."""
        mask = b"" if len(delivered) == len(uids) else _mask(uids, delivered)
        keep = self._window if expires_in_s is None else min(self._window, expires_in_s)
        self._kept.put(batch_id, mask, max(keep, 0.0) + REPLY_GRACE_S)

    def seen(self, batch_id: str) -> bool:
        return batch_id in self._kept

    def get(self, batch_id: str, uids: Sequence[str]) -> tuple[list[str], list[str]] | None:
        """(delivered, missing) of the first attempt of `batch_id`, or None."""
        mask = self._kept.get(batch_id)
        if mask is None:
            return None
        if not mask:
            return list(uids), []
        if len(mask) != (len(uids) + 7) // 8:
            return None  # not the same batch after all
        delivered: list[str] = []
        missing: list[str] = []
        for i, uid in enumerate(uids):
            (delivered if mask[i >> 3] >> (i & 7) & 1 else missing).append(uid)
        return delivered, missing


def _mask(uids: Sequence[str], delivered: Sequence[str]) -> bytes:
    wrote = set(delivered)
    mask = bytearray((len(uids) + 7) // 8)
    for i, uid in enumerate(uids):
        if uid in wrote:
            mask[i >> 3] |= 1 << (i & 7)
    return bytes(mask)
