"""Which position an ack names, and the pace acks leave at (pure: times are passed in)."""

from __future__ import annotations

import itertools
import json

import pytest
from imroute_client.acks import Ack, AckPacer, AckTracker, ack_frame


def test_the_frame_is_the_contract_s() -> None:
    assert json.loads(ack_frame("1~2~0~0~g1~0")) == {"type": "ack", "pos": "1~2~0~0~g1~0"}
    assert ack_frame("p") == '{"type":"ack","pos":"p"}'


def test_acks_are_cumulative_and_count_what_they_newly_cover() -> None:
    t = AckTracker()
    numbers = [t.message(f"p{i}") for i in range(1, 6)]
    assert numbers == [1, 2, 3, 4, 5]
    assert t.ack(2, "p2") == Ack("p2", 2)
    assert t.ack(1, "p1") is None  # older than one made: covered
    assert t.ack(2, "p2") is None
    assert t.ack(5, "p5") == Ack("p5", 3)
    assert t.received - t.covered == 0


def test_a_push_not_handed_out_cannot_be_acked() -> None:
    t = AckTracker()
    t.message("p1")
    with pytest.raises(ValueError, match="push 2 was not handed out"):
        t.ack(2, "p2")


def test_a_duplicate_is_acked_at_once_when_nothing_before_it_is_held() -> None:
    t = AckTracker()
    assert t.duplicate("p1") == Ack("p1", 1)  # a replay of an id seen on the last connection
    t.message("p2")
    t.ack(2, "p2")
    assert t.duplicate("p3") == Ack("p3", 1)


def test_a_duplicate_after_a_held_push_waits_and_goes_with_its_ack() -> None:
    t = AckTracker()
    t.message("p1")
    t.message("p2")
    assert t.duplicate("p3") is None  # the app still holds p1 and p2
    assert t.duplicate("p4") is None
    assert t.ack(1, "p1") == Ack("p1", 1)  # p2 is still held: the duplicates wait
    assert t.ack(2, "p2") == Ack("p4", 3)  # the last handed: the duplicates after it too
    t.message("p5")
    assert t.duplicate("p6") is None
    assert t.received == 6 and t.covered == 4


def test_pushes_without_a_pos_take_no_acks() -> None:
    t = AckTracker()
    t.message(None)
    assert t.ack(1, None) is None
    assert t.duplicate(None) is None
    t.message("p3")
    assert t.ack(3, "p3") == Ack("p3", 3)


def test_the_first_ack_goes_at_once_and_later_ones_keep_the_interval() -> None:
    p = AckPacer(0.1)
    assert p.due() is None and p.poll(0.0) is None
    assert p.offer(Ack("a", 1)) is True
    assert p.poll(10.0) == Ack("a", 1)
    assert p.offer(Ack("b", 1)) is True
    assert p.offer(Ack("c", 2)) is False  # merged: the sender is already waiting
    assert p.due() == pytest.approx(10.1)
    assert p.poll(10.05) is None
    assert p.pending == Ack("c", 3)  # the latest position, every push it covers
    assert p.poll(10.1) == Ack("c", 3)
    assert p.pending is None and p.due() is None
    # Idle for a while: the next one goes at once again.
    p.offer(Ack("d", 1))
    assert p.poll(20.0) == Ack("d", 1)


def test_a_burst_leaves_at_most_one_frame_per_interval_the_latest_last() -> None:
    p = AckPacer(0.1)
    sent: list[tuple[float, Ack]] = []
    now = 0.0
    for i in range(1, 201):  # a push every 2 ms, a timer that fires when due
        now = i * 0.002
        p.offer(Ack(f"p{i}", 1))
        ack = p.poll(now)
        if ack is not None:
            sent.append((now, ack))
    due = p.due()
    assert due is not None and due - now <= 0.1
    last = p.poll(due)
    assert last is not None
    sent.append((due, last))
    times = [t for t, _ in sent]
    assert all(b - a >= 0.1 - 1e-9 for a, b in itertools.pairwise(times))
    assert len(sent) <= 0.4 / 0.1 + 1
    assert sent[-1][1].pos == "p200"
    assert sum(a.count for _, a in sent) == 200


def test_take_gives_the_pending_ack_whatever_the_pace() -> None:
    p = AckPacer(60.0)
    p.offer(Ack("a", 1))
    assert p.poll(0.0) == Ack("a", 1)
    p.offer(Ack("b", 1))
    assert p.poll(1.0) is None
    assert p.take() == Ack("b", 1)
    assert p.take() is None and p.due() is None


def test_a_negative_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        AckPacer(-0.1)
