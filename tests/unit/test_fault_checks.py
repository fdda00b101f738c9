"""The fault tests' order check (tests/integration/fault_ledger.py): what it lets pass
across a move between groups, and what it still calls out of order."""

from __future__ import annotations

from tests.integration.fault_clients import Got
from tests.integration.fault_ledger import Ledger, check

GROUPS = {"gw1": "g1", "gw2": "g1", "gw3": "g2"}


def ledger(*keys: tuple[str, float]) -> Ledger:
    book = Ledger()
    for key, accepted in keys:
        book.add("fanout", key, ["amy"])
        book.times[key] = accepted
    return book


def got(*pushes: tuple[str, float, str]) -> list[Got]:
    return [Got(f"m-{key}", key, False, at, where) for key, at, where in pushes]


def test_a_multicast_from_the_old_group_may_come_after_a_later_one_of_the_new() -> None:
    book = ledger(("mc:0", 0.0), ("mc:1", 1.0), ("mc:2", 2.0))
    # amy moved from g1 to g2 at 1.5; mc:1, accepted before, came through the old
    # group's log after mc:2 (the new group's).
    amy = got(("mc:0", 0.1, "gw1"), ("mc:2", 2.1, "gw3"), ("mc:1", 2.5, "gw3"))
    assert check("amy", amy, book, GROUPS) == []
    # Without the groups, or within one group (one log), it is out of order.
    assert any("out of order" in p for p in check("amy", amy, book))
    same = got(("mc:0", 0.1, "gw1"), ("mc:2", 2.1, "gw2"), ("mc:1", 2.5, "gw2"))
    assert any("out of order" in p for p in check("amy", same, book, GROUPS))


def test_an_inversion_away_from_the_move_is_still_out_of_order() -> None:
    book = ledger(("mc:0", 0.0), ("mc:1", 1.0), ("mc:2", 5.0), ("mc:3", 6.0))
    # The move at 2.1; mc:2 and mc:3 were both accepted after it.
    amy = got(
        ("mc:0", 0.1, "gw1"), ("mc:1", 2.1, "gw3"), ("mc:3", 6.1, "gw3"), ("mc:2", 6.2, "gw3")
    )
    problems = check("amy", amy, book, GROUPS)
    assert any("multicast out of order" in p for p in problems), problems
    # Left out of the order is not left out of the rest: a copy is still a copy.
    twice = got(("mc:0", 0.1, "gw1"), ("mc:1", 2.1, "gw3"), ("mc:1", 2.2, "gw3"))
    assert any("twice" in p for p in check("amy", twice, ledger(("mc:0", 0), ("mc:1", 1)), GROUPS))
