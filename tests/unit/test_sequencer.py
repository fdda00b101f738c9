"""The topic sequencer: batches leave in seq order, gaps are filled or skipped, late
copies are dropped."""

from __future__ import annotations

from shared.positions import seq_of
from shared.proto import gateway_pb2
from socket_gateway.sequencer import TopicSequencer


def b(seq: int) -> gateway_pb2.Batch:
    return gateway_pb2.Batch(batch_id=f"b{seq}", seq=seq)


def seqs(batches: list[gateway_pb2.Batch]) -> list[int]:
    return [x.seq for x in batches]


def test_in_order_batches_leave_at_once() -> None:
    s = TopicSequencer("broadcast", next_seq=5)
    assert seqs(s.offer(b(5), 0.0)) == [5]
    assert seqs(s.offer(b(6), 0.0)) == [6]
    assert s.delivered_through == 6 and s.gap(10.0) is None


def test_an_early_batch_waits_for_the_one_before_it() -> None:
    s = TopicSequencer("broadcast", next_seq=1, hold_s=0.5)
    assert s.offer(b(2), 0.0) == []
    assert s.offer(b(3), 0.1) == []
    assert s.gap(0.3) is None  # still within the hold
    assert seqs(s.offer(b(1), 0.4)) == [1, 2, 3]
    assert s.gap(5.0) is None


def test_a_gap_that_outlives_the_hold_is_read_from_the_log() -> None:
    s = TopicSequencer("broadcast", next_seq=1, hold_s=0.5)
    s.offer(b(4), 0.0)
    assert s.gap(0.6) == (0, 3)
    # The log still has 1 and 3; 2 was trimmed: skipped and counted.
    ready = s.fill(0, 3, [b(1), b(3)], 0.6)
    assert seqs(ready) == [1, 3, 4]
    assert (s.filled, s.lost, s.delivered_through) == (2, 1, 4)


def test_a_last_batch_the_bus_lost_is_found_through_the_head() -> None:
    s = TopicSequencer("group.g1", next_seq=8, hold_s=0.5)
    s.saw_head(9, 1.0)
    assert s.gap(1.2) is None
    assert s.gap(1.6) == (7, 9)
    assert seqs(s.fill(7, 9, [b(8), b(9)], 1.6)) == [8, 9]
    assert s.gap(9.0) is None


def test_late_and_repeated_copies_are_dropped() -> None:
    s = TopicSequencer("broadcast", next_seq=3)
    assert s.offer(b(2), 0.0) == []  # from before this gateway followed the topic
    s.offer(b(5), 0.0)
    assert s.offer(b(5), 0.0) == []  # a redelivery while it waits
    assert seqs(s.offer(b(3), 0.0)) == [3]
    assert seqs(s.offer(b(4), 0.0)) == [4, 5]
    assert s.offer(b(4), 0.0) == []
    assert s.late == 3


def test_a_fill_ignores_what_it_did_not_ask_for() -> None:
    s = TopicSequencer("broadcast", next_seq=1, hold_s=0.1)
    s.offer(b(3), 0.0)
    ready = s.fill(0, 2, [b(1), b(2), b(3), b(7)], 1.0)
    assert seqs(ready) == [1, 2, 3] and s.next_seq == 4


def at(epoch: int, n: int) -> gateway_pb2.Batch:
    """Batch `n` of the topic's log born at `epoch` (as the bus carries it)."""
    return gateway_pb2.Batch(batch_id=f"b{epoch}.{n}", seq=n, epoch=epoch)


def test_a_log_redis_lost_is_followed_from_its_first_batch_under_its_new_epoch() -> None:
    """Redis restarted empty: the log starts again at 1 under a later epoch. Before
    epochs the new 1, 2, 3 were dropped as late copies, for ever."""
    s = TopicSequencer("broadcast", next_seq=seq_of(100, 41), hold_s=0.5)
    assert [x.seq for x in s.offer(at(100, 41), 0.0)] == [41]
    s.offer(at(100, 43), 0.0)  # 42 never came, and now never will: its log is gone
    ready = s.offer(at(200, 1), 0.1)
    assert [(x.epoch, x.seq) for x in ready] == [(100, 43), (200, 1)]
    assert [x.seq for x in s.offer(at(200, 2), 0.2)] == [2]
    assert s.offer(at(100, 44), 0.3) == []  # a straggler of the lost epoch: late
    assert (s.epochs, s.late, s.delivered_through) == (1, 1, seq_of(200, 2))


def test_a_new_epoch_seen_first_through_the_head_reads_that_log_from_its_start() -> None:
    """The bus lost the first batches of the new log (a consumer group created again
    after them): the head shows the new epoch and the log is read from its first seq."""
    s = TopicSequencer("group.g1", next_seq=seq_of(100, 8), hold_s=0.5)
    assert s.saw_head(seq_of(200, 2), 1.0) == []
    assert s.gap(1.6) == (seq_of(200, 0), seq_of(200, 2))
    assert [x.seq for x in s.fill(*s.gap(1.6) or (0, 0), [at(200, 1), at(200, 2)], 1.6)] == [1, 2]
    assert s.saw_head(seq_of(100, 9), 2.0) == []  # an old head read late: not back
    assert s.delivered_through == seq_of(200, 2) and s.epochs == 1


def test_a_gap_never_spans_two_epochs() -> None:
    s = TopicSequencer("broadcast", next_seq=seq_of(200, 1), hold_s=0.1)
    assert s.fill(seq_of(100, 5), seq_of(100, 9), [], 1.0) == []
    assert s.lost == 0 and s.next_seq == seq_of(200, 1)
