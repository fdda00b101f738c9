"""A slot-tagged receipt's states from its values and the users' cursors, a gateway's
early mark read with them, a counts-only receipt's queued, and the counts and pages of
recipients both stores read from states (router.receipts.base, pure)."""

from __future__ import annotations

import pytest

from router.receipts.base import (
    ACKED,
    DELIVERED,
    EXPIRED,
    QUEUED,
    derive,
    listed,
    recipient_page,
    stored_value,
    tally,
    unwritten,
    with_early,
)
from shared.errors import InvalidInput
from shared.positions import seq_of

E = 7  # the users' logs' epoch


def at(state: str, n: int, epoch: int = E) -> str:
    return stored_value(state, seq_of(epoch, n))


@pytest.mark.parametrize(
    ("value", "cursor", "state"),
    [
        (at(DELIVERED, 5), (E, 4, 0), DELIVERED),  # not acked yet
        (at(DELIVERED, 5), (E, 5, 0), ACKED),
        # Acked, then the inbox bound's floor passed it (newer messages, unacked).
        (at(DELIVERED, 5), (E, 5, 9), ACKED),
        (at(DELIVERED, 5), (E, 20, 9), ACKED),  # and the devices acked those later
        (at(DELIVERED, 5), (E, 4, 9), DELIVERED),  # pushed out unacked
        (at(QUEUED, 5), (E, 4, 0), QUEUED),  # waits in the inbox
        # A device acked past it, so it was written it: the delivered mark was late or
        # lost (a gateway crashed before its flush, a P2P answer was lost).
        (at(QUEUED, 5), (E, 6, 0), ACKED),
        # Pushed out of the inbox by the bound, unwritten (acked past or not).
        (at(QUEUED, 5), (E, 4, 5), EXPIRED),
        (at(QUEUED, 5), (E, 6, 5), EXPIRED),
        # Left out by a connect for its ttl_s: the gateway marked it (x).
        (at(EXPIRED, 5), (E, 6, 0), EXPIRED),
        (at(DELIVERED, 5, E - 1), (E, 9, 9), DELIVERED),  # another epoch: as recorded
        (at(QUEUED, 5, E - 1), (E, 9, 9), QUEUED),
        (at(DELIVERED, 5), None, DELIVERED),  # no cursor read
        (at(EXPIRED, 5), (E, 9, 0), EXPIRED),  # never acked
        (ACKED, (E, 0, 0), ACKED),  # a gateway's mark
    ],
)
def test_derive(value: str, cursor: tuple[int, int, int] | None, state: str) -> None:
    assert derive(value, cursor) == state


def test_an_early_mark_is_read_with_the_value_the_record_wrote_over_it() -> None:
    assert with_early(at(DELIVERED, 5), ACKED) == ACKED
    assert with_early(at(QUEUED, 5), DELIVERED) == at(DELIVERED, 5)  # still derives
    assert with_early(at(DELIVERED, 5), EXPIRED) == at(DELIVERED, 5)  # never down
    assert with_early(None, ACKED) == ACKED  # not recorded yet


def test_a_counts_only_receipts_queued_is_what_is_left() -> None:
    assert unwritten(10, 3, 2) == 5
    assert unwritten(10, 9, 2) == 0  # estimates and per-mark counts: never below 0
    assert unwritten(0, 4, 0) == 0  # a broadcast to everyone online


def test_states_are_tallied_with_a_zero_for_each_state_none_holds() -> None:
    assert tally([ACKED, QUEUED, ACKED]) == {QUEUED: 1, EXPIRED: 0, DELIVERED: 0, ACKED: 2}
    assert tally(()) == {QUEUED: 0, EXPIRED: 0, DELIVERED: 0, ACKED: 0}


def test_a_list_is_paged_in_uid_order_after_the_cursor() -> None:
    states = {"d": QUEUED, "a": DELIVERED, "c": ACKED, "b": EXPIRED, "e": DELIVERED}
    unacked = listed("unacked")
    first = recipient_page(states, unacked, None, 2)
    assert (first.uids, first.cursor) == (["a", "b"], "b")
    last = recipient_page(states, unacked, first.cursor, 2)
    assert (last.uids, last.cursor) == (["d", "e"], None)  # exactly the rest: no next page
    assert recipient_page(states, listed("acked"), None, 10).uids == ["c"]
    assert recipient_page(states, listed("queued"), "d", 10).uids == []


def test_a_list_that_is_not_one_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidInput, match="state: must be acked, unacked or queued"):
        listed("delivered")
