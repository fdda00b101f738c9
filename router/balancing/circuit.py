"""A gateway's circuit breaker, on an injected clock (pure, no I/O).

Closed -> N consecutive transport failures -> open -> cool-off -> half-open, where
exactly one probe call goes through. A call's outcome moves the circuit only if the call
started in the circuit's current epoch: a straggler that started before the circuit
opened cannot close it (or reopen it) afterwards.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from shared.clock import Clock

__all__ = ["BreakerState", "CircuitBreaker", "Permit"]


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"  # the cool-off is over: one probe call may go through


@dataclass(frozen=True, slots=True)
class Permit:
    """Leave to make one call, from the circuit as it was when the call started."""

    epoch: int
    probe: bool


@dataclass(slots=True)
class CircuitBreaker:
    """Closed -> (N consecutive failures) -> open -> (cool-off) -> half-open, one probe ->
    closed on its success, open again (for another cool-off) on its failure."""

    threshold: int
    cool_off_s: float
    clock: Clock
    on_change: Callable[[bool], None] | None = None  # told `closed` on every open and close
    _epoch: int = 0  # moves on every transition; permits of older epochs are stale
    _failures: int = 0
    _opened_at: float | None = None
    _probe_since: float | None = None

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self.clock.monotonic() - self._opened_at < self.cool_off_s:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    def available(self) -> bool:
        """Whether `acquire` would give a permit now (no side effect)."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        return state is BreakerState.HALF_OPEN and self._probe_slot_free()

    def acquire(self) -> Permit | None:
        """A permit to call, or None; in half-open, the one probe's permit."""
        state = self.state
        if state is BreakerState.CLOSED:
            return Permit(self._epoch, probe=False)
        if state is BreakerState.OPEN or not self._probe_slot_free():
            return None
        if self._probe_since is not None:
            self._epoch += 1  # the lost probe's late outcome no longer counts
        self._probe_since = self.clock.monotonic()
        return Permit(self._epoch, probe=True)

    def on_success(self, permit: Permit) -> None:
        if permit.epoch != self._epoch:
            return
        if permit.probe:
            self._close()
        else:
            self._failures = 0

    def on_failure(self, permit: Permit) -> None:
        if permit.epoch != self._epoch:
            return
        if permit.probe:
            self._open()
            return
        self._failures += 1
        if self.threshold and self._failures >= self.threshold:
            self._open()

    def release(self, permit: Permit) -> None:
        """The call ended without a verdict on the gateway: free the probe slot."""
        if permit.probe and permit.epoch == self._epoch:
            self._probe_since = None

    def probe_now(self) -> None:
        """Cut an open circuit's cool-off short: the next call is its probe (the gateway
        announced a new life, so the failures that opened it may be over)."""
        if self.state is BreakerState.OPEN:
            assert self._opened_at is not None
            self._opened_at = self.clock.monotonic() - self.cool_off_s

    def _probe_slot_free(self) -> bool:
        # A probe that has been out longer than a whole cool-off is taken as lost (its
        # caller's deadline should be far shorter), so the circuit cannot stay stuck.
        since = self._probe_since
        return since is None or self.clock.monotonic() - since >= self.cool_off_s

    def _open(self) -> None:
        self._epoch += 1
        self._opened_at = self.clock.monotonic()
        self._probe_since = None
        self._failures = 0
        if self.on_change is not None:
            self.on_change(False)

    def _close(self) -> None:
        self._epoch += 1
        self._opened_at = None
        self._probe_since = None
        self._failures = 0
        if self.on_change is not None:
            self.on_change(True)
