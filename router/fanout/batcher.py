"""GroupBatcher: the pure core of group multicast batching.

One batcher serves one push. Recipients arrive group by group as their routes are
resolved; each group's buffer is published when it holds `batch_size` uids, or when
its oldest entry has waited `flush_timeout_s`, and whatever is left goes at the end of
the input. A high-priority push never waits: every buffer flushes after each chunk of
input. Time comes from the injected clock, so all of this is testable without sleeping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from enum import StrEnum

from shared.clock import Clock

__all__ = ["FlushReason", "GroupBatcher", "ReadyBatch"]


class FlushReason(StrEnum):
    FULL = "full"
    TIMEOUT = "timeout"
    PRIORITY = "priority"
    END = "end"


@dataclass(frozen=True, slots=True)
class ReadyBatch:
    group_id: str
    uids: tuple[str, ...]
    reason: FlushReason


@dataclass(slots=True)
class _Buffer:
    since: float
    uids: list[str] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class GroupBatcher:
    clock: Clock
    batch_size: int = 1000
    flush_timeout_s: float = 1.0
    _: KW_ONLY
    high_priority: bool = False
    _buffers: dict[str, _Buffer] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self.flush_timeout_s <= 0:
            raise ValueError("flush_timeout_s must be positive")

    def add(self, group_id: str, uid: str) -> ReadyBatch | None:
        """Buffer one recipient; returns the group's batch if that filled it.

        Callers add each (group, uid) once per push: a set of every uid seen would cost
        memory per recipient, and a per-buffer one would miss repeats across a flush.
        """
        buf = self._buffers.get(group_id)
        if buf is None:
            buf = self._buffers[group_id] = _Buffer(self.clock.monotonic())
        buf.uids.append(uid)
        if len(buf.uids) >= self.batch_size:
            return self._take(group_id, FlushReason.FULL)
        return None

    def add_many(self, group_id: str, uids: Sequence[str]) -> list[ReadyBatch]:
        """Buffer recipients of one group in order; returns the batches they filled.

        The same as `add` for each uid, with one buffer look-up per call instead of per
        uid: a 1000-uid chunk of a multicast arrives as a few lists, one per group.
        """
        ready: list[ReadyBatch] = []
        start, end = 0, len(uids)
        while start < end:
            buf = self._buffers.get(group_id)
            if buf is None:
                buf = self._buffers[group_id] = _Buffer(self.clock.monotonic())
            stop = start + self.batch_size - len(buf.uids)
            buf.uids.extend(uids[start:stop])
            start = stop
            if len(buf.uids) >= self.batch_size:
                ready.append(self._take(group_id, FlushReason.FULL))
        return ready

    def chunk_done(self) -> list[ReadyBatch]:
        """After a chunk of input: high priority flushes everything, else what is due."""
        if self.high_priority:
            return [self._take(g, FlushReason.PRIORITY) for g in list(self._buffers)]
        return self.due()

    def due(self) -> list[ReadyBatch]:
        """Buffers whose oldest entry has waited the flush timeout."""
        now = self.clock.monotonic()
        return [
            self._take(g, FlushReason.TIMEOUT)
            for g, buf in list(self._buffers.items())
            if now - buf.since >= self.flush_timeout_s
        ]

    def next_deadline(self) -> float | None:
        """When the oldest buffered entry comes due (monotonic seconds), if any."""
        if not self._buffers:
            return None
        return min(buf.since for buf in self._buffers.values()) + self.flush_timeout_s

    def drain(self) -> list[ReadyBatch]:
        """End of input: everything left, one batch per group."""
        return [self._take(g, FlushReason.END) for g in list(self._buffers)]

    def pending(self) -> int:
        return sum(len(buf.uids) for buf in self._buffers.values())

    def _take(self, group_id: str, reason: FlushReason) -> ReadyBatch:
        buf = self._buffers.pop(group_id)
        return ReadyBatch(group_id, tuple(buf.uids), reason)
