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


def got(*pushes: tuple[str, float, str] | tuple[str, float, str, bool]) -> list[Got]:
    return [Got(f"m-{p[0]}", p[0], len(p) > 3 and bool(p[3]), p[1], p[2]) for p in pushes]


def out_of_order(problems: list[str]) -> bool:
    return any("multicast out of order" in p for p in problems)


def test_a_multicast_from_the_old_group_may_come_after_a_later_one_of_the_new() -> None:
    book = ledger(("mc:0", 0.0), ("mc:1", 1.0), ("mc:2", 2.0))
    # amy's last push through g1 at 0.1, her first through g2 at 2.1: mc:1, accepted
    # before, came through the old group's log after mc:2, which came live through g2.
    amy = got(("mc:0", 0.1, "gw1"), ("mc:2", 2.1, "gw3"), ("mc:1", 2.5, "gw3"))
    assert check("amy", amy, book, GROUPS) == []
    # Without the groups, or within one group (one log), it is out of order.
    assert out_of_order(check("amy", amy, book))
    same = got(("mc:0", 0.1, "gw1"), ("mc:2", 2.1, "gw2"), ("mc:1", 2.5, "gw2"))
    assert out_of_order(check("amy", same, book, GROUPS))


def test_inversions_the_move_does_not_explain_are_out_of_order() -> None:
    book = ledger(("mc:0", 0.0), ("mc:1", 1.0), ("mc:2", 1.2), ("mc:3", 5.0), ("mc:4", 6.0))
    # Both after the move, both accepted after it: one log's order.
    late = got(
        ("mc:0", 0.1, "gw1"), ("mc:1", 2.1, "gw3"), ("mc:2", 2.2, "gw3"),
        ("mc:4", 6.1, "gw3"), ("mc:3", 6.2, "gw3"),
    )  # fmt: skip
    assert out_of_order(check("amy", late, book, GROUPS))
    # mc:2 came through the old group before the move, mc:1 (accepted before it, in
    # the same log) after: a gap the move does not explain.
    gap = got(("mc:0", 0.1, "gw1"), ("mc:2", 1.3, "gw1"), ("mc:1", 2.5, "gw3"))
    three = ledger(("mc:0", 0), ("mc:1", 1.0), ("mc:2", 1.2))
    assert out_of_order(check("amy", gap, three, GROUPS))
    # Two of the old log, both replayed after the move, swapped.
    swapped = got(("mc:0", 0.1, "gw1"), ("mc:2", 2.1, "gw3", True), ("mc:1", 2.2, "gw3", True))
    assert out_of_order(check("amy", swapped, three, GROUPS))


def test_left_out_of_the_order_is_not_left_out_of_the_rest() -> None:
    twice = got(("mc:0", 0.1, "gw1"), ("mc:1", 2.1, "gw3"), ("mc:1", 2.2, "gw3"))
    problems = check("amy", twice, ledger(("mc:0", 0), ("mc:1", 1)), GROUPS)
    assert any("twice" in p for p in problems), problems
