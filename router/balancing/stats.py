"""Per-gateway call statistics, each with its circuit breaker, on an injected clock (pure).

Like Ribbon's ServerStats and its circuit-tripping logic, except that outcomes are
reported on the `Ticket` that started the call, which holds its gateway's entries: a
gateway forgotten (and maybe re-added) meanwhile is not touched.

A gateway's circuit: closed -> N consecutive transport failures -> open -> cool-off ->
half-open, where exactly one probe call goes through. A call's outcome moves the circuit
only if the call started in the circuit's current epoch: a straggler that started before
the circuit opened cannot close it (or reopen it) afterwards.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from shared.clock import Clock
from shared.errors import ConfigError

__all__ = [
    "BreakerState",
    "CircuitBreaker",
    "Permit",
    "ServerStats",
    "StatsRegistry",
    "StatsSettings",
    "Ticket",
]


log = logging.getLogger(__name__)


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


@dataclass(frozen=True, slots=True)
class StatsSettings:
    """When a gateway's circuit opens, and for how long."""

    # consecutive transport failures that open the circuit; 0: the circuit never opens
    failure_threshold: int = 5
    cool_off_s: float = 10.0  # how long an open circuit refuses calls before a probe

    def __post_init__(self) -> None:
        threshold = self.failure_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
            raise ConfigError(f"failure_threshold: {threshold!r} is not a whole number >= 0")
        if not (math.isfinite(self.cool_off_s) and self.cool_off_s > 0):
            raise ConfigError(f"cool_off_s: {self.cool_off_s!r} is not a positive number")


@dataclass(slots=True)
class ServerStats:
    """Counters of one gateway's calls."""

    in_flight: int = 0
    successes: int = 0
    failures: int = 0
    consecutive_failures: int = 0

    def on_start(self) -> None:
        self.in_flight += 1

    def on_success(self) -> None:
        self._end()
        self.successes += 1
        self.consecutive_failures = 0

    def on_failure(self) -> None:
        self._end()
        self.failures += 1
        self.consecutive_failures += 1

    def on_release(self) -> None:
        """A call that ended neither way (cancelled, or an error that is not the gateway's)."""
        self._end()

    def _end(self) -> None:
        self.in_flight = max(0, self.in_flight - 1)


@dataclass(frozen=True, slots=True)
class Ticket:
    """One started call: report its outcome to the registry with this."""

    gateway_id: str
    permit: Permit
    stats: ServerStats = field(repr=False, compare=False)
    breaker: CircuitBreaker = field(repr=False, compare=False)


@dataclass(slots=True)
class _Entry:
    stats: ServerStats
    breaker: CircuitBreaker


class StatsRegistry:
    """ServerStats and a CircuitBreaker per gateway id, created on first use."""

    def __init__(self, clock: Clock, settings: StatsSettings | None = None) -> None:
        self.clock = clock
        self.settings = settings or StatsSettings()
        self._entries: dict[str, _Entry] = {}
        # Gateways whose circuit is not closed: `allow` is asked for every gateway on every
        # choice, and this keeps the common case (closed) to one set look-up.
        self._tripped: set[str] = set()

    def _entry(self, gateway_id: str) -> _Entry:
        entry = self._entries.get(gateway_id)
        if entry is None:
            s = self.settings
            breaker = CircuitBreaker(s.failure_threshold, s.cool_off_s, self.clock)
            entry = self._entries[gateway_id] = _Entry(ServerStats(), breaker)
            breaker.on_change = self._watch(gateway_id, breaker)
        return entry

    def _watch(self, gateway_id: str, breaker: CircuitBreaker) -> Callable[[bool], None]:
        def changed(closed: bool) -> None:
            entry = self._entries.get(gateway_id)
            if entry is None or entry.breaker is not breaker:
                return  # a forgotten gateway's breaker
            if closed:
                self._tripped.discard(gateway_id)
                log.warning("circuit of gateway %s closed: calls go through again", gateway_id)
            else:
                self._tripped.add(gateway_id)
                log.warning(
                    "circuit of gateway %s open: its calls fail fast for %.1fs",
                    gateway_id,
                    self.settings.cool_off_s,
                )

        return changed

    def stats(self, gateway_id: str) -> ServerStats:
        return self._entry(gateway_id).stats

    def known(self) -> list[str]:
        """The gateways it holds stats and a circuit for."""
        return list(self._entries)

    def breaker(self, gateway_id: str) -> CircuitBreaker:
        return self._entry(gateway_id).breaker

    def in_flight(self, gateway_id: str) -> int:
        entry = self._entries.get(gateway_id)
        return 0 if entry is None else entry.stats.in_flight

    def allow(self, gateway_id: str) -> bool:
        """Whether a call to it may start now: its circuit is closed, or half-open with the
        probe slot free. No side effect (the probe slot is taken by `on_start`)."""
        if gateway_id not in self._tripped:
            return True
        return self._entries[gateway_id].breaker.available()

    def on_start(self, gateway_id: str) -> Ticket | None:
        """Start a call: a ticket to report its outcome on, or None if the circuit refuses."""
        entry = self._entry(gateway_id)
        permit = entry.breaker.acquire()
        if permit is None:
            return None
        entry.stats.on_start()
        return Ticket(gateway_id, permit, entry.stats, entry.breaker)

    def on_success(self, ticket: Ticket) -> None:
        ticket.stats.on_success()
        ticket.breaker.on_success(ticket.permit)

    def on_failure(self, ticket: Ticket) -> None:
        """The call failed for the gateway's fault (a transport error)."""
        ticket.stats.on_failure()
        ticket.breaker.on_failure(ticket.permit)

    def on_release(self, ticket: Ticket) -> None:
        """The call ended without a verdict: cancelled, or an error that is not the gateway's."""
        ticket.stats.on_release()
        ticket.breaker.release(ticket.permit)

    def restarted(self, gateway_id: str) -> None:
        """The gateway came back (a new start time in the fleet): an open circuit probes
        at once instead of waiting out its cool-off. One that keeps crashing fails the
        probe and stays open."""
        entry = self._entries.get(gateway_id)
        if entry is not None:
            entry.breaker.probe_now()

    def forget(self, gateway_id: str) -> None:
        """Drop a gateway that left the fleet."""
        self._entries.pop(gateway_id, None)
        self._tripped.discard(gateway_id)

    def retain(self, gateway_ids: set[str] | frozenset[str]) -> None:
        """Drop every gateway not in `gateway_ids` (the live fleet), except one whose
        circuit is open: a flapping gateway that drops out of the fleet and comes back
        within its cool-off must not come back with a clean slate. It goes at the first
        `retain` after its cool-off."""
        for gateway_id, entry in list(self._entries.items()):
            if gateway_id in gateway_ids or entry.breaker.state is BreakerState.OPEN:
                continue
            self.forget(gateway_id)

    def __contains__(self, gateway_id: object) -> bool:
        return gateway_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)
