"""Per-gateway stats and the circuit breaker, on a ManualClock (nothing sleeps)."""

from __future__ import annotations

import pytest

from router.balancing import BreakerState, ServerStats, StatsRegistry, StatsSettings, Ticket
from router.testing import ManualClock
from shared.errors import ConfigError


def registry(clock: ManualClock, threshold: int = 3, cool_off_s: float = 10.0) -> StatsRegistry:
    return StatsRegistry(clock, StatsSettings(failure_threshold=threshold, cool_off_s=cool_off_s))


def fail(reg: StatsRegistry, gateway_id: str, n: int) -> None:
    for _ in range(n):
        ticket = reg.on_start(gateway_id)
        assert ticket is not None
        reg.on_failure(ticket)


def probing(
    clock: ManualClock, threshold: int, cool_off_s: float = 10.0
) -> tuple[StatsRegistry, Ticket]:
    """A registry whose circuit to gw1 opened (`threshold` failures) and cooled off, and
    the ticket of its half-open probe."""
    reg = registry(clock, threshold=threshold, cool_off_s=cool_off_s)
    fail(reg, "gw1", threshold)
    clock.advance(cool_off_s)
    probe = reg.on_start("gw1")
    assert probe is not None
    return reg, probe


def test_failures_count_consecutively_and_a_success_resets_them() -> None:
    stats = ServerStats()
    stats.on_success()
    for n in (1, 2, 3):
        stats.on_start()
        stats.on_failure()
        assert stats.consecutive_failures == n
    stats.on_success()
    assert (stats.successes, stats.failures, stats.consecutive_failures) == (2, 3, 0)


def test_in_flight_counts_started_calls_until_they_end() -> None:
    reg = registry(ManualClock())
    tickets = [reg.on_start("gw1") for _ in range(3)]
    assert reg.in_flight("gw1") == 3
    assert all(t is not None for t in tickets)
    a, b, c = (t for t in tickets if t is not None)
    reg.on_success(a)
    reg.on_failure(b)
    reg.on_release(c)
    assert reg.in_flight("gw1") == 0
    stats = reg.stats("gw1")
    assert (stats.successes, stats.failures) == (1, 1)


def test_circuit_opens_after_n_consecutive_failures_only() -> None:
    clock = ManualClock()
    reg = registry(clock, threshold=3)
    fail(reg, "gw1", 2)
    ok = reg.on_start("gw1")
    assert ok is not None
    reg.on_success(ok)  # a success in between resets the count
    fail(reg, "gw1", 2)
    assert reg.breaker("gw1").state is BreakerState.CLOSED
    assert reg.allow("gw1")
    fail(reg, "gw1", 1)
    assert reg.breaker("gw1").state is BreakerState.OPEN
    assert not reg.allow("gw1")
    assert reg.on_start("gw1") is None
    assert reg.in_flight("gw1") == 0  # a refused call is not in flight


def test_half_open_lets_exactly_one_probe_through_and_its_success_closes() -> None:
    clock = ManualClock()
    reg = registry(clock, threshold=2, cool_off_s=10.0)
    fail(reg, "gw1", 2)
    clock.advance(9.9)
    assert reg.breaker("gw1").state is BreakerState.OPEN
    assert reg.on_start("gw1") is None
    clock.advance(0.1)
    assert reg.breaker("gw1").state is BreakerState.HALF_OPEN
    assert reg.allow("gw1")
    assert reg.allow("gw1")  # allow() only looks: the slot is still free
    probe = reg.on_start("gw1")
    assert probe is not None and probe.permit.probe
    assert not reg.allow("gw1")
    assert reg.on_start("gw1") is None
    assert reg.on_start("gw1") is None
    reg.on_success(probe)
    assert reg.breaker("gw1").state is BreakerState.CLOSED
    tickets = [reg.on_start("gw1") for _ in range(5)]
    assert all(t is not None and not t.permit.probe for t in tickets)


def test_probe_failure_reopens_for_a_whole_cool_off() -> None:
    clock = ManualClock()
    reg, probe = probing(clock, threshold=2)
    clock.advance(3.0)
    reg.on_failure(probe)
    assert reg.breaker("gw1").state is BreakerState.OPEN
    clock.advance(9.9)
    assert not reg.allow("gw1")
    clock.advance(0.1)
    assert reg.allow("gw1")
    second = reg.on_start("gw1")
    assert second is not None and second.permit.probe


def test_a_released_probe_frees_the_slot() -> None:
    reg, probe = probing(ManualClock(), threshold=1)
    reg.on_release(probe)  # e.g. cancelled: no verdict
    assert reg.breaker("gw1").state is BreakerState.HALF_OPEN
    assert reg.on_start("gw1") is not None


def test_stragglers_from_before_the_opening_do_not_move_the_circuit() -> None:
    clock = ManualClock()
    reg = registry(clock, threshold=2)
    early_ok = reg.on_start("gw1")
    early_bad = reg.on_start("gw1")
    assert early_ok is not None and early_bad is not None
    fail(reg, "gw1", 2)
    clock.advance(10.0)
    probe = reg.on_start("gw1")
    assert probe is not None
    reg.on_success(early_ok)  # started when closed: says nothing about now
    assert reg.breaker("gw1").state is BreakerState.HALF_OPEN
    assert reg.on_start("gw1") is None  # the probe still holds the slot
    reg.on_failure(early_bad)
    assert reg.breaker("gw1").state is BreakerState.HALF_OPEN
    reg.on_success(probe)
    assert reg.breaker("gw1").state is BreakerState.CLOSED
    assert reg.stats("gw1").successes == 2  # the stats still count every outcome


def test_a_probe_out_for_a_whole_cool_off_is_taken_as_lost() -> None:
    clock = ManualClock()
    reg, lost = probing(clock, threshold=1, cool_off_s=5.0)
    clock.advance(4.9)
    assert reg.on_start("gw1") is None
    clock.advance(0.1)
    second = reg.on_start("gw1")
    assert second is not None and second.permit.probe
    reg.on_success(lost)  # too late to count
    assert reg.breaker("gw1").state is BreakerState.HALF_OPEN
    reg.on_failure(second)
    assert reg.breaker("gw1").state is BreakerState.OPEN


def test_registry_creates_on_demand_and_forgets() -> None:
    reg = registry(ManualClock())
    assert reg.allow("new") and "new" not in reg  # looking does not create
    assert reg.in_flight("new") == 0 and "new" not in reg
    reg.stats("a")
    reg.breaker("b")
    reg.stats("c")
    assert len(reg) == 3
    reg.forget("a")
    reg.forget("missing")
    assert "a" not in reg
    reg.retain({"c"})
    assert "b" not in reg and "c" in reg and len(reg) == 1


def test_forgetting_a_tripped_gateway_clears_its_circuit() -> None:
    clock = ManualClock()
    reg = registry(clock, threshold=1)
    fail(reg, "gw1", 1)
    fail(reg, "gw2", 1)
    assert not reg.allow("gw1") and not reg.allow("gw2")
    reg.forget("gw1")
    assert reg.allow("gw1")
    # gw2 left the fleet while its circuit is open: kept until its cool-off is over.
    reg.retain(set())
    assert not reg.allow("gw2") and len(reg) == 1
    clock.advance(10.0)
    reg.retain(set())
    assert reg.allow("gw2") and len(reg) == 0


def test_an_outcome_for_a_forgotten_gateway_does_not_touch_its_successor() -> None:
    reg = registry(ManualClock(), threshold=1)
    old = reg.on_start("gw1")
    assert old is not None
    reg.forget("gw1")
    reg.on_failure(old)  # would open a threshold-1 circuit
    assert reg.allow("gw1")
    assert reg.stats("gw1").failures == 0


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"failure_threshold": -1}, "failure_threshold"),
        ({"failure_threshold": True}, "failure_threshold"),
        ({"cool_off_s": 0.0}, "cool_off_s"),
        ({"cool_off_s": float("nan")}, "cool_off_s"),
    ],
)
def test_bad_settings_name_the_setting(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        StatsSettings(**kwargs)  # type: ignore[arg-type]


def test_a_threshold_of_zero_never_opens_the_circuit() -> None:
    reg = registry(ManualClock(), threshold=0)
    fail(reg, "gw1", 10_000)
    assert reg.allow("gw1") and reg.breaker("gw1").state is BreakerState.CLOSED
