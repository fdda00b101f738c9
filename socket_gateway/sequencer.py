"""Pure: puts one topic's batches back in log order before the gateway delivers them.

The bus may deliver a topic's batches out of order (Pub/Sub does, and so do two
publishers racing), late (a redelivery) or not at all (a trimmed stream, a publish
that failed after the batch was logged). Every batch carries its seq in the topic's
dense recovery log, so the gateway hands batches to its sockets strictly in seq order:
a batch ahead of the next expected one waits, and when the gap has not closed after
`hold_s` the shell reads the missing seqs from the log (`gap` says which, `filled`
takes them). The shell also reports the log's head now and then (`saw_head`), so a
last batch that the bus lost is fetched too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.proto import gateway_pb2

__all__ = ["TopicSequencer"]


@dataclass(slots=True)
class TopicSequencer:
    topic: str
    next_seq: int  # the seq delivered next; everything below it was delivered or skipped
    hold_s: float = 0.5
    _pending: dict[int, gateway_pb2.Batch] = field(default_factory=dict)
    _head: int = 0
    _waiting_since: float | None = None
    late: int = 0  # arrived after their seq was delivered or filled: dropped
    filled: int = 0  # fetched from the log because the bus had not brought them in time
    lost: int = 0  # neither on the bus nor any longer in the log: skipped

    @property
    def delivered_through(self) -> int:
        return self.next_seq - 1

    def offer(self, batch: gateway_pb2.Batch, now: float) -> list[gateway_pb2.Batch]:
        """Take one batch from the bus; the batches now ready, in seq order."""
        seq = batch.seq
        if seq < self.next_seq or seq in self._pending:
            self.late += 1
            return []
        self._pending[seq] = batch
        self._head = max(self._head, seq)
        return self._ready(now)

    def saw_head(self, head: int, now: float) -> None:
        """The log's head, as read from the store: seqs up to it are owed to us."""
        self._head = max(self._head, head)
        self._mark(now)

    def gap(self, now: float) -> tuple[int, int] | None:
        """(after, upto): the seqs to read from the log, once a gap outlived `hold_s`."""
        if self._waiting_since is None or now - self._waiting_since < self.hold_s:
            return None
        upto = min(self._pending) - 1 if self._pending else self._head
        return (self.next_seq - 1, upto) if upto >= self.next_seq else None

    def fill(
        self, after: int, upto: int, batches: list[gateway_pb2.Batch], now: float
    ) -> list[gateway_pb2.Batch]:
        """Take what the log held for (after, upto]; what it lacked is skipped as lost."""
        for batch in batches:
            if after < batch.seq <= upto and batch.seq >= self.next_seq:
                self._pending.setdefault(batch.seq, batch)
                self.filled += 1
        ready = self._ready(now)
        while self.next_seq <= upto and self.next_seq not in self._pending:
            self.lost += 1
            self.next_seq += 1
            ready.extend(self._ready(now))
        self._waiting_since = None
        self._mark(now)
        return ready

    def _ready(self, now: float) -> list[gateway_pb2.Batch]:
        ready: list[gateway_pb2.Batch] = []
        pending = self._pending
        while self.next_seq in pending:
            ready.append(pending.pop(self.next_seq))
            self.next_seq += 1
        self._mark(now)
        return ready

    def _mark(self, now: float) -> None:
        owed = bool(self._pending) or self._head >= self.next_seq
        if not owed:
            self._waiting_since = None
        elif self._waiting_since is None:
            self._waiting_since = now
