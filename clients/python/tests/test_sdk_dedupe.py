"""The dedupe window."""

from __future__ import annotations

import pytest
from imroute_client.dedupe import DedupeWindow


def test_a_msg_id_seen_again_is_a_duplicate() -> None:
    w = DedupeWindow(3)
    assert not w.seen("a")
    assert w.seen("a")
    assert not w.seen("b")


def test_the_window_is_bounded_and_forgets_the_least_recently_seen() -> None:
    w = DedupeWindow(2)
    for m in ("a", "b"):
        w.seen(m)
    assert w.seen("a")  # a is now the newest
    w.seen("c")  # b leaves
    assert len(w) == 2
    assert not w.seen("b")
    assert w.seen("c")


def test_size_zero_keeps_nothing_and_a_negative_size_is_refused() -> None:
    w = DedupeWindow(0)
    assert not w.seen("a") and not w.seen("a")
    assert len(w) == 0
    with pytest.raises(ValueError, match="negative"):
        DedupeWindow(-1)
