from __future__ import annotations

from shared.clock import ManualClock
from socket_gateway.dedup import RecentIds, RecentReplies


def test_a_repeated_id_is_caught_within_the_window() -> None:
    clock = ManualClock()
    ids = RecentIds(clock, window_s=10)
    assert not ids.check_and_add("b1")
    clock.advance(9.9)
    assert ids.check_and_add("b1")
    assert not ids.check_and_add("b2")


def test_ids_are_forgotten_after_the_window() -> None:
    clock = ManualClock()
    ids = RecentIds(clock, window_s=10)
    ids.check_and_add("b1")
    clock.advance(10)
    assert not ids.check_and_add("b1")  # seen again, but long ago: delivered again
    assert len(ids) == 1


def test_the_set_is_bounded() -> None:
    ids = RecentIds(ManualClock(), window_s=1e9, max_entries=100)
    for i in range(1000):
        ids.check_and_add(f"b{i}")
    assert len(ids) == 100
    assert ids.check_and_add("b999")
    assert not ids.check_and_add("b0")


def test_recent_replies_answer_within_the_window_and_the_cap() -> None:
    clock = ManualClock()
    replies: RecentReplies[str] = RecentReplies(clock, window_s=10, max_entries=2)
    replies.put("a", "first")
    assert replies.get("a") == "first"
    assert replies.get("b") is None
    clock.advance(10)
    assert replies.get("a") is None  # past its window
    replies.put("b", "2")
    replies.put("c", "3")
    replies.put("d", "4")  # over the cap: the oldest goes
    assert replies.get("b") is None and replies.get("c") == "3" and replies.get("d") == "4"
    assert len(replies) == 2
