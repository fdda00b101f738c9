"""shared.expiring: a bounded expiring map on an injected clock (pure)."""

from __future__ import annotations

from router.testing import ManualClock
from shared.expiring import ExpiringMap


def sized(
    clock: ManualClock, max_entries: int = 100, max_bytes: int = 1 << 20
) -> ExpiringMap[str, bytes]:
    return ExpiringMap(clock.monotonic, lambda k, v: len(k) + len(v), max_entries, max_bytes)


def test_an_entry_is_kept_until_its_deadline() -> None:
    clock = ManualClock()
    m = sized(clock)
    m.put("a", b"xy", 10)
    clock.advance(9.9)
    assert m.get("a") == b"xy" and "a" in m
    clock.advance(0.1)
    assert m.get("a") is None and "a" not in m
    assert len(m) == 1  # still held until it reaches the old end of a later put
    m.put("b", b"", 10)
    assert len(m) == 1 and m.evicted_early == 0


def test_add_is_a_seen_check() -> None:
    clock = ManualClock()
    m = sized(clock)
    assert not m.add("a", b"", 5)
    clock.advance(4)
    assert m.add("a", b"", 5)  # seen: not kept longer for it
    clock.advance(1)
    assert not m.add("a", b"", 5)  # expired: new again
    assert len(m) == 1 and m.bytes == 1


def test_the_count_is_bounded_and_early_evictions_counted() -> None:
    m = sized(ManualClock(), max_entries=3)
    for key in "abcde":
        m.put(key, b"", 100)
    assert len(m) == 3 and m.evicted_early == 2
    assert m.get("a") is None and m.get("e") == b""


def test_the_bytes_are_bounded() -> None:
    m = sized(ManualClock(), max_bytes=10)
    m.put("a", b"1234", 100)
    m.put("b", b"1234", 100)
    assert m.bytes == 10
    m.put("c", b"1", 100)  # 2 more bytes: the oldest goes
    assert m.get("a") is None and m.bytes == 7 and m.evicted_early == 1


def test_a_put_replaces_and_moves_to_the_young_end() -> None:
    clock = ManualClock()
    m = sized(clock, max_entries=2)
    m.put("a", b"1", 10)
    m.put("b", b"1", 10)
    m.put("a", b"22", 10)  # room made first: "a" was the oldest, and went
    assert m.get("a") == b"22" and m.get("b") == b"1"
    assert m.bytes == 5 and len(m) == 2 and m.evicted_early == 1
    m.put("c", b"", 10)  # "b" is the oldest now
    assert m.get("b") is None and m.get("a") == b"22"


def test_an_expired_entry_leaves_without_counting_as_early() -> None:
    clock = ManualClock()
    m = sized(clock, max_entries=1)
    m.put("a", b"", 1)
    clock.advance(1)
    m.put("b", b"", 1)
    assert m.evicted_early == 0 and len(m) == 1
