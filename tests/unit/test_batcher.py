"""GroupBatcher with an injected clock: size, timeout, priority and end-of-input flushes."""

from __future__ import annotations

import pytest

from router.fanout.batcher import FlushReason, GroupBatcher
from router.testing import ManualClock


def test_a_group_flushes_when_it_reaches_batch_size() -> None:
    b = GroupBatcher(ManualClock(), batch_size=3)
    assert b.add("g1", "a") is None
    assert b.add("g2", "x") is None
    assert b.add("g1", "b") is None
    full = b.add("g1", "c")
    assert full is not None
    assert (full.group_id, full.uids, full.reason) == ("g1", ("a", "b", "c"), FlushReason.FULL)
    assert b.pending() == 1  # g2's x still waits
    assert b.add("g1", "d") is None  # a fresh buffer


def test_a_group_that_never_fills_flushes_on_timeout() -> None:
    clock = ManualClock()
    b = GroupBatcher(clock, batch_size=1000, flush_timeout_s=1.0)
    b.add("g1", "a")
    clock.advance(0.5)
    b.add("g2", "x")
    assert b.due() == []
    assert b.next_deadline() == pytest.approx(1.0)
    clock.advance(0.5)
    (due,) = b.due()
    assert (due.group_id, due.uids, due.reason) == ("g1", ("a",), FlushReason.TIMEOUT)
    assert b.next_deadline() == pytest.approx(1.5)  # g2's oldest entry
    clock.advance(0.49)
    assert b.chunk_done() == []
    clock.advance(0.01)
    assert [r.group_id for r in b.chunk_done()] == ["g2"]
    assert b.next_deadline() is None


def test_the_timeout_counts_from_the_oldest_entry_not_the_newest() -> None:
    clock = ManualClock()
    b = GroupBatcher(clock, batch_size=1000, flush_timeout_s=1.0)
    b.add("g1", "a")
    for i in range(9):
        clock.advance(0.1)
        b.add("g1", f"u{i}")  # a steady trickle must not postpone the flush
    clock.advance(0.11)
    (due,) = b.due()
    assert len(due.uids) == 10


def test_high_priority_flushes_every_buffer_after_each_chunk() -> None:
    b = GroupBatcher(ManualClock(), batch_size=1000, high_priority=True)
    b.add("g1", "a")
    b.add("g2", "x")
    flushed = b.chunk_done()
    assert {(r.group_id, r.uids, r.reason) for r in flushed} == {
        ("g1", ("a",), FlushReason.PRIORITY),
        ("g2", ("x",), FlushReason.PRIORITY),
    }
    assert b.pending() == 0


def test_end_of_input_drains_everything_once() -> None:
    b = GroupBatcher(ManualClock(), batch_size=2)
    for uid in "abcde":
        b.add("g1", uid)
    b.add("g2", "x")
    drained = b.drain()
    assert {(r.group_id, r.uids) for r in drained} == {("g1", ("e",)), ("g2", ("x",))}
    assert all(r.reason is FlushReason.END for r in drained)
    assert b.drain() == []


@pytest.mark.parametrize(("size", "timeout"), [(0, 1.0), (10, 0.0), (10, -1.0)])
def test_bad_settings_are_refused(size: int, timeout: float) -> None:
    with pytest.raises(ValueError, match=r"batch_size|flush_timeout_s"):
        GroupBatcher(ManualClock(), batch_size=size, flush_timeout_s=timeout)


def test_batches_never_exceed_the_size_and_lose_nothing() -> None:
    b = GroupBatcher(ManualClock(), batch_size=1000)
    out = []
    for i in range(2500):
        ready = b.add(f"g{i % 4}", f"u{i}")
        if ready:
            out.append(ready)
    out += b.drain()
    assert all(len(r.uids) <= 1000 for r in out)
    assert sorted(u for r in out for u in r.uids) == sorted(f"u{i}" for i in range(2500))
    per_group = {g: sum(1 for r in out if r.group_id == g) for g in ("g0", "g1", "g2", "g3")}
    assert per_group == {"g0": 1, "g1": 1, "g2": 1, "g3": 1}  # 625 each: one batch per group


def test_add_many_fills_batches_like_add_one_by_one() -> None:
    clock = ManualClock()
    one, many = GroupBatcher(clock, batch_size=3), GroupBatcher(clock, batch_size=3)
    groups = {"g1": [f"a{i}" for i in range(7)], "g2": ["x"], "g3": [], "g4": ["y", "z", "w"]}
    expected = [r for g, uids in groups.items() for u in uids if (r := one.add(g, u))]
    got = [r for g, uids in groups.items() for r in many.add_many(g, uids)]
    assert got == expected
    assert [(r.group_id, r.uids) for r in got] == [
        ("g1", ("a0", "a1", "a2")),
        ("g1", ("a3", "a4", "a5")),
        ("g4", ("y", "z", "w")),
    ]
    assert many.drain() == one.drain()  # g1's a6 and g2's x, nothing of g3


def test_add_many_tops_up_a_partly_filled_buffer_and_keeps_its_age() -> None:
    clock = ManualClock()
    b = GroupBatcher(clock, batch_size=4, flush_timeout_s=1.0)
    b.add("g1", "a")
    clock.advance(0.5)
    (full,) = b.add_many("g1", ["b", "c", "d", "e"])
    assert full.uids == ("a", "b", "c", "d")
    # "e" starts a new buffer now, so it comes due a full timeout later.
    assert b.next_deadline() == pytest.approx(1.5)
    assert b.add_many("g1", []) == []
    assert b.pending() == 1
