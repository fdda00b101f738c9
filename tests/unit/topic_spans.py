"""An in-memory topic log read as `read_topic.lua` reads it, and TopicSpans over it."""

from __future__ import annotations

import asyncio

from router.recovery.base import LoggedBatch, TopicSpan
from shared.clock import ManualClock
from shared.positions import counter_of, epoch_of, seq_of
from shared.proto import gateway_pb2
from socket_gateway.resume_budget import ResumeLimits
from socket_gateway.topic_spans import TopicSpans

__all__ = ["SIZE", "E", "Log", "at", "logged_batch", "seqs", "spans"]

E = 1_790_000_000_000
SIZE = 100  # bytes of each entry


def at(n: int, epoch: int = E) -> int:
    return seq_of(epoch, n)


class Log:
    """One topic's log of `n` entries of SIZE bytes, read as `read_topic.lua` reads it."""

    def __init__(self, n: int, epoch: int = E, gate: asyncio.Event | None = None) -> None:
        self.n, self.epoch, self.gate = n, epoch, gate
        self.calls: list[tuple[int, int | None]] = []  # (after, upto) of each read
        self.sent = 0  # bytes it answered with

    async def read_span(
        self, topic: str, after: int, upto: int | None, max_entries: int, max_bytes: int
    ) -> TopicSpan:
        self.calls.append((after, upto))
        if self.gate is not None:
            await self.gate.wait()
        head = self.n
        if not head:
            return TopicSpan(0)  # an empty log (or none): no head, as the store says
        lo = counter_of(after) if epoch_of(after) == self.epoch else 0
        hi = head
        if upto is not None:
            hi = min(counter_of(upto), head) if epoch_of(upto) == self.epoch else 0
        if hi <= lo:
            return TopicSpan(at(head, self.epoch))
        fit = min(max_entries, max_bytes // SIZE)  # read backward from `hi`
        start = max(lo, hi - fit)
        batches = [logged_batch(at(k, self.epoch), ["u1"]) for k in range(start + 1, hi + 1)]
        self.sent += SIZE * len(batches)
        over = start > lo
        cut = at(start, self.epoch) if over else 0
        return TopicSpan(at(head, self.epoch), batches, [SIZE] * len(batches), over, cut)


def logged_batch(seq: int, uids: list[str], stored: bool = False) -> LoggedBatch:
    return LoggedBatch(
        gateway_pb2.Batch(
            batch_id=f"b{seq}",
            message=gateway_pb2.Message(
                msg_id=f"m{seq}", content_json=b"" if stored else b"1", content_stored=stored
            ),
            uids=uids,
            seq=counter_of(seq),
            epoch=epoch_of(seq),
        )
    )


def spans(log: Log, clock: ManualClock | None = None, **kw: int) -> TopicSpans:
    limits = ResumeLimits(max_entries=kw.get("entries", 100), max_bytes=kw.get("bytes", 5000))
    return TopicSpans(log, clock or ManualClock(), limits)  # type: ignore[arg-type]


def seqs(history: object) -> list[int]:
    assert history is not None
    return [counter_of(b.seq) for b in history.batches]  # type: ignore[attr-defined]
