from __future__ import annotations

from shared.clock import ManualClock
from socket_gateway.supervise import RestartBudget


def test_delays_grow_then_the_budget_runs_out() -> None:
    clock = ManualClock()
    budget = RestartBudget(clock, max_failures=4, window_s=60, first_delay_s=0.5, max_delay_s=1.5)
    assert [budget.failed() for _ in range(3)] == [0.5, 1.0, 1.5]
    assert budget.failed() is None  # the 4th failure within a minute: give up


def test_failures_older_than_the_window_are_forgotten() -> None:
    clock = ManualClock()
    budget = RestartBudget(clock, max_failures=3, window_s=60)
    budget.failed()
    budget.failed()
    clock.advance(61)
    assert budget.failed() == 0.5 and budget.recent == 1  # a fresh start, not a give-up
