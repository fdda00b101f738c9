"""Retry-same, retry-next and the backoff between them."""

from __future__ import annotations

import pytest
from imroute_client.backoff import Backoff
from imroute_client.policy import (
    USER_CAP_WAIT_S,
    Outcome,
    RetryState,
    Step,
    classify,
    classify_status,
    next_step,
)

B = Backoff(0.1, 5.0)


def step(state: RetryState, outcome: Outcome, lived: float = 0.0, retries: int = 2) -> Step:
    return next_step(state, outcome, lived, retries_same=retries, backoff=B, stable_s=5.0,
                     rand=lambda: 0.5)  # fmt: skip


def test_close_codes() -> None:
    assert classify(4503, False) is Outcome.MOVE
    assert classify(1000, True) is Outcome.MOVE  # told to reconnect first
    assert classify(None, True) is Outcome.MOVE
    assert classify(None, False) is Outcome.TRANSPORT
    assert classify(1001, False) is Outcome.CLOSED
    assert classify(1013, False) is Outcome.CLOSED


def test_handshake_answers() -> None:
    assert classify_status(401) is Outcome.UNAUTHORIZED
    assert classify_status(503) is Outcome.MOVE  # full or draining
    assert classify_status(429) is Outcome.MOVE  # over a connect rate
    assert classify_status(404) is Outcome.CLOSED
    assert classify_status(500) is Outcome.CLOSED


def test_transport_errors_retry_the_same_gateway_then_the_next() -> None:
    s = RetryState()
    steps = [step(s, Outcome.TRANSPORT) for _ in range(4)]
    assert [x.dispatch for x in steps] == [False, False, True, False]
    assert [x.delay_s for x in steps] == pytest.approx([0.1, 0.1, 0.2, 0.4])


def test_a_move_goes_at_once_but_a_second_in_a_row_waits() -> None:
    s = RetryState()
    assert step(s, Outcome.MOVE, lived=60) == Step(True, 0.0)
    again = step(s, Outcome.MOVE)
    assert again.dispatch and again.delay_s == pytest.approx(0.1)
    assert step(s, Outcome.MOVE, lived=60) == Step(True, 0.0)  # that one had lived


def test_a_connection_that_lived_starts_the_backoff_over() -> None:
    s = RetryState()
    for _ in range(5):
        step(s, Outcome.CLOSED)
    assert step(s, Outcome.CLOSED).delay_s > 1.0
    fresh = step(s, Outcome.TRANSPORT, lived=10.0)
    assert not fresh.dispatch and fresh.delay_s == pytest.approx(0.1)


def test_other_closes_ask_dispatch_after_a_backoff_and_a_refused_token_is_not_planned() -> None:
    s = RetryState()
    closed = step(s, Outcome.CLOSED)
    assert closed.dispatch and closed.delay_s == pytest.approx(0.1)
    assert step(s, Outcome.TRANSPORT, retries=0).dispatch
    with pytest.raises(ValueError, match="401"):
        step(s, Outcome.UNAUTHORIZED)


def test_the_per_user_cap_waits_instead_of_moving_at_once() -> None:
    reason = "too many connections for this user (at most 10, IMROUTE_MAX_CONNECTIONS_PER_USER)"
    assert classify(4429, False, reason) is Outcome.USER_CAP
    # No gateway closes 4429 for another reason (a full one refuses before the 101):
    # such a close is no move.
    assert classify(4429, False, "gateway full") is Outcome.CLOSED
    state = RetryState()
    first = step(state, Outcome.USER_CAP)
    assert first.dispatch and first.delay_s >= USER_CAP_WAIT_S  # never at once
    assert step(state, Outcome.USER_CAP).delay_s >= USER_CAP_WAIT_S
    assert step(RetryState(), Outcome.MOVE).delay_s == 0.0  # unlike a drain or a full one
