"""Placing a connecting client on a gateway (GET /v1/dispatch): the live fleet, a rule,
and the placements made since the fleet was last read.

The fleet comes from a short-lived cache (`CachedFleet`), so its connection counts are
up to a heartbeat old. In a reconnect storm every user of a group would then land on
the same "least-loaded" gateway; so the dispatcher counts its own placements per
gateway on top of the record's count, and forgets them when the fleet is read again.
"""

from __future__ import annotations

from collections import Counter

from router.balancing import (
    Availability,
    GatewayState,
    NoEligibleGateway,
    Rule,
    ZoneAffinityRule,
    rule_for,
)
from router.balancing.stats import StatsRegistry
from router.fleet.cache import CachedFleet
from shared.clock import Clock
from shared.models import GatewayInfo

__all__ = ["Dispatcher", "to_state"]

# What a gateway that announces no limit (an older one) is taken to hold.
UNLIMITED = 1 << 31
# Zones clients name are remembered (each with its rule) up to this many.
MAX_ZONES = 64


def to_state(info: GatewayInfo, placed: int = 0) -> GatewayState:
    """The balancer's view of a fleet record, with `placed` connections on the way."""
    return GatewayState(
        gateway_id=info.gateway_id,
        group_id=info.group_id,
        ws_url=info.ws_url,
        grpc_address=info.grpc_address,
        connections=info.connections + placed,
        max_connections=info.max_connections or UNLIMITED,
        zone=info.zone,
        draining=info.draining,
        started_at_ms=info.started_ms,
        heartbeat_deadline_ms=info.deadline_ms,
    )


class Dispatcher:
    """Chooses the gateway a client should connect to, by the configured rule."""

    def __init__(
        self,
        fleet: CachedFleet,
        clock: Clock,
        rule_name: str,
        stats: StatsRegistry | None = None,
    ) -> None:
        self._fleet = fleet
        self._available = Availability(clock, stats)
        self._rule_name = rule_name
        # Built now, so a bad IMROUTE_DISPATCH_RULE stops the service at start-up; kept,
        # so round robin's counter carries over from one request to the next.
        self._rule = rule_for(rule_name, self._available)
        self._zoned: dict[str, Rule] = {}
        self._snapshot: list[GatewayInfo] | None = None
        self._placed: Counter[str] = Counter()

    async def choose(self, uid: str, zone: str | None = None) -> GatewayState:
        """The gateway for `uid`; NoEligibleGateway (a GatewayUnavailable) when none can
        take a connection now."""
        infos = await self._fleet.live()
        if infos is not self._snapshot:
            self._snapshot = infos
            self._placed.clear()
        states = [to_state(info, self._placed[info.gateway_id]) for info in infos]
        chosen = self._rule_for_zone(zone).choose(states, uid)
        if chosen is None:
            raise NoEligibleGateway(
                "no gateway can take a connection now (none live, or all draining or full)"
            )
        self._placed[chosen.gateway_id] += 1
        return chosen

    def _rule_for_zone(self, zone: str | None) -> Rule:
        if zone is None or not isinstance(self._rule, ZoneAffinityRule):
            return self._rule
        rule = self._zoned.get(zone)
        if rule is None and len(self._zoned) >= MAX_ZONES:
            return self._rule  # unknown zones beyond the cap: no preference
        if rule is None:
            rule = self._zoned[zone] = rule_for(self._rule_name, self._available, zone=zone)
        return rule
