"""Pure: puts one topic's batches back in log order before the gateway delivers them.

The bus may deliver a topic's batches out of order (Pub/Sub does, and so do two
publishers racing), late (a redelivery) or not at all (a trimmed stream, a publish
that failed after the batch was logged). Every batch carries its seq in the topic's
dense recovery log, so the gateway hands batches to its sockets strictly in seq order:
a batch ahead of the next expected one waits, and when the gap has not closed after
`hold_s` the shell reads the missing seqs from the log (`gap` says which, `filled`
takes them). The shell also reports the log's head now and then (`saw_head`), so a
last batch that the bus lost is fetched too.

Seqs are compared whole (`shared.positions`: the log's epoch above its counter). A batch
or a head of a later epoch means Redis lost the log and started it again: what the
sequencer still held of the old epoch leaves at once, in order (its holes can no longer
be read), and it follows the new epoch from its first seq, instead of taking the new,
small counters for late copies (`epochs` counts those starts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.positions import epoch_of, seq_of
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
    epochs: int = 0  # the log started again under a new epoch (Redis lost it)

    @property
    def delivered_through(self) -> int:
        return self.next_seq - 1

    def offer(self, batch: gateway_pb2.Batch, now: float) -> list[gateway_pb2.Batch]:
        """Take one batch from the bus; the batches now ready, in seq order."""
        seq = seq_of(batch.epoch, batch.seq)
        ready = self._follow_epoch(seq, now)
        if seq < self.next_seq or seq in self._pending:
            self.late += 1
            return ready
        self._pending[seq] = batch
        self._head = max(self._head, seq)
        ready.extend(self._ready(now))
        return ready

    def saw_head(self, head: int, now: float) -> list[gateway_pb2.Batch]:
        """The log's head, as read from the store: seqs up to it are owed to us. The
        batches it makes ready (those left of an older epoch), in seq order."""
        ready = self._follow_epoch(head, now)
        self._head = max(self._head, head)
        self._mark(now)
        return ready

    def _follow_epoch(self, seq: int, now: float) -> list[gateway_pb2.Batch]:
        """When `seq` is of a later epoch than ours, start that epoch: what is held of
        ours leaves now, in order. Only forward: a head read before a newer batch came
        must not take the sequencer back."""
        epoch = epoch_of(seq)
        if epoch <= epoch_of(self.next_seq):
            return []
        if self.next_seq > 1 or self._pending:  # not the log's birth, seen from nothing
            self.epochs += 1
        pending, self._pending = self._pending, {}
        ready = [pending[s] for s in sorted(pending)]
        self.next_seq = seq_of(epoch, 1)
        self._head = self.next_seq - 1
        self._waiting_since = None
        self._mark(now)
        return ready

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
            seq = seq_of(batch.epoch, batch.seq)
            if after < seq <= upto and seq >= self.next_seq:
                self._pending.setdefault(seq, batch)
                self.filled += 1
        ready = self._ready(now)
        same_epoch = epoch_of(upto) == epoch_of(self.next_seq)
        while same_epoch and self.next_seq <= upto and self.next_seq not in self._pending:
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
