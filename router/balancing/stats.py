"""Per-gateway call statistics, each with its circuit breaker, on an injected clock (pure).

Like Ribbon's ServerStats and its circuit-tripping logic (`circuit`), except that
outcomes are reported on the `Ticket` that started the call, which holds its gateway's
entries: a gateway forgotten (and maybe re-added) meanwhile is not touched.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from router.balancing.circuit import BreakerState, CircuitBreaker, Permit
from shared.clock import Clock
from shared.errors import ConfigError

__all__ = [
    "ServerStats",
    "StatsRegistry",
    "StatsSettings",
    "Ticket",
]


log = logging.getLogger(__name__)


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
