"""Balancing rules: filter the eligible gateways, then pick one (Ribbon's PredicateBasedRule).

Every rule is given an `Availability` and never picks a gateway it rejects, so no caller
can forget the filter. Rules are pure: the time comes from the injected clock and the
circuit state from the StatsRegistry; nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from typing import Protocol

from router.balancing.servers import GatewayState
from router.balancing.stats import StatsRegistry
from shared.clock import Clock
from shared.errors import ConfigError

__all__ = [
    "RULE_NAMES",
    "RULE_SETTING",
    "Availability",
    "ConsistentHashRule",
    "LeastConnectionsRule",
    "RoundRobinRule",
    "Rule",
    "ZoneAffinityRule",
    "hrw_score",
    "rule_for",
]

RULE_SETTING = "IMROUTE_DISPATCH_RULE"
RULE_NAMES = ("consistent_hash", "round_robin", "least_connections", "zone_affinity")


class Rule(Protocol):
    def choose(self, servers: Sequence[GatewayState], key: str | None) -> GatewayState | None:
        """One eligible gateway of `servers` (`key`: the uid, if any), or None."""
        ...


class Availability:
    """Whether a gateway may be chosen: heartbeat fresh, not draining, below its connection
    limit (unless `require_capacity` is off), and its circuit closed or free to probe."""

    def __init__(
        self, clock: Clock, stats: StatsRegistry | None = None, *, require_capacity: bool = True
    ) -> None:
        self.clock = clock
        self.stats = stats
        self.require_capacity = require_capacity

    def filter(self, servers: Sequence[GatewayState]) -> list[GatewayState]:
        """The eligible ones, in order; it runs for every gateway on every choice."""
        now_ms = self.clock.now_ms()
        if self.require_capacity:
            fit = [
                s
                for s in servers
                if s.heartbeat_deadline_ms > now_ms
                and not s.draining
                and s.connections < s.max_connections
            ]
        else:
            fit = [s for s in servers if s.heartbeat_deadline_ms > now_ms and not s.draining]
        if self.stats is None:
            return fit
        allow = self.stats.allow
        return [s for s in fit if allow(s.gateway_id)]

    def in_flight(self, server: GatewayState) -> int:
        return 0 if self.stats is None else self.stats.in_flight(server.gateway_id)


class _EligibleRule:
    """A rule that picks among the eligible gateways of `servers` (none: None)."""

    def __init__(self, available: Availability) -> None:
        self.available = available

    def choose(self, servers: Sequence[GatewayState], key: str | None) -> GatewayState | None:
        eligible = self.available.filter(servers)
        return self._pick(eligible, key) if eligible else None

    def _pick(self, eligible: list[GatewayState], key: str | None) -> GatewayState:
        raise NotImplementedError


class RoundRobinRule(_EligibleRule):
    """Each eligible gateway in turn (Ribbon's incrementAndGetModulo).

    `next()` on an itertools.count is a single C call, so it is atomic under the GIL and
    two threads never get the same number; the router runs on one event loop anyway.
    Python ints do not overflow, so there is no need for Ribbon's compare-and-set modulo.
    """

    def __init__(self, available: Availability) -> None:
        super().__init__(available)
        self._counter = itertools.count()

    def _pick(self, eligible: list[GatewayState], key: str | None) -> GatewayState:
        return eligible[next(self._counter) % len(eligible)]


class LeastConnectionsRule(_EligibleRule):
    """The eligible gateway with the fewest connections; ties go to the fewest calls in
    flight, then to the smallest id, so the choice is deterministic."""

    def _pick(self, eligible: list[GatewayState], key: str | None) -> GatewayState:
        fewest = min(s.connections for s in eligible)
        tied = [s for s in eligible if s.connections == fewest]
        if len(tied) == 1:
            return tied[0]
        return min(tied, key=lambda s: (self.available.in_flight(s), s.gateway_id))


def hrw_score(group_id: str, key: str) -> int:
    """Rendezvous weight of `key` for a group: stable across processes and restarts
    (blake2b, never the salted built-in hash)."""
    # NUL cannot occur in a group id (shared.keys.ID_PATTERN), so the pair is unambiguous.
    return _score(group_id.encode() + b"\x00" + key.encode())


def _score(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class ConsistentHashRule(_EligibleRule):
    """Rendezvous (HRW) hashing of the uid over the groups that have an eligible gateway,
    then the least-loaded eligible gateway of that group.

    A user lands in the same group every time, so multicast batches stay whole. Adding
    a group moves only about 1/(n+1) of the users (those it now wins); losing one moves
    only its own users. Without a key it takes the least-loaded eligible gateway.
    """

    def _pick(self, eligible: list[GatewayState], key: str | None) -> GatewayState:
        if key is None:
            return min(eligible, key=self._load)
        suffix = b"\x00" + key.encode()
        best, best_score = "", -1
        for group in dict.fromkeys(s.group_id for s in eligible):
            score = _score(group.encode() + suffix)
            # Equal scores (a 2^-64 chance) go to the smallest group id: every router agrees.
            if score > best_score or (score == best_score and group < best):
                best, best_score = group, score
        return min((s for s in eligible if s.group_id == best), key=self._load)

    def _load(self, s: GatewayState) -> tuple[float, int, int, str]:
        # Relative load, so a gateway with twice the capacity takes twice the users.
        return (s.load, s.connections, self.available.in_flight(s), s.gateway_id)


class ZoneAffinityRule:
    """The wrapped rule over the eligible gateways of `zone` when there is one, else over
    every eligible gateway (the zone is the client's or this router's, fixed per rule)."""

    def __init__(self, zone: str | None, fallback: Rule, available: Availability) -> None:
        self.zone = zone
        self.fallback = fallback
        self.available = available

    def choose(self, servers: Sequence[GatewayState], key: str | None) -> GatewayState | None:
        if self.zone is not None:
            local = [s for s in self.available.filter(servers) if s.zone == self.zone]
            if local:
                return self.fallback.choose(local, key)
        return self.fallback.choose(servers, key)


def rule_for(name: str, available: Availability, *, zone: str | None = None) -> Rule:
    """The rule named by IMROUTE_DISPATCH_RULE; zone_affinity wraps consistent_hash."""
    match name.strip().lower():
        case "consistent_hash":
            return ConsistentHashRule(available)
        case "round_robin":
            return RoundRobinRule(available)
        case "least_connections":
            return LeastConnectionsRule(available)
        case "zone_affinity":
            return ZoneAffinityRule(zone, ConsistentHashRule(available), available)
    raise ConfigError(f"{RULE_SETTING}: {name!r} is not one of {', '.join(RULE_NAMES)}")
