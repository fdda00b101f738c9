"""Placing a connecting client on a gateway (GET /v1/dispatch): the live fleet, a rule,
and the placements made since the fleet was last read.

The fleet comes from a short-lived cache (`CachedFleet`), so its connection counts are
up to a heartbeat old. In a reconnect storm every user of a group would then land on
the same "least-loaded" gateway; so the dispatcher counts its own placements per
gateway on top of the record's count, and forgets them when the fleet is read again.

A client that could not connect to a gateway names it (`avoid`): that gateway is not
chosen for it while another can take it, and the report counts as a failed connect
(`router.balancing.connects`). With `ConnectHealth`, gateways many clients report are
skipped for everyone, read from the fleet's counts each time the fleet is read.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection, Sequence

from router.balancing import (
    Availability,
    ConnectReports,
    ConnectSettings,
    GatewayState,
    NoEligibleGateway,
    Rule,
    ZoneAffinityRule,
    failing,
    rule_for,
)
from router.balancing.connects import CONNECT_FAILURES, CONNECTS
from router.balancing.stats import StatsRegistry
from router.fleet.cache import CachedFleet
from router.stats.base import CountSums
from shared.clock import Clock
from shared.errors import ImrouteError
from shared.models import GatewayInfo
from shared.throttled import ThrottledLine

__all__ = ["ConnectHealth", "Dispatcher", "choose_avoiding", "to_state"]

log = logging.getLogger(__name__)

# What a gateway that announces no limit (max_connections 0) is taken to hold.
UNLIMITED = 1 << 31
# Zones clients name are remembered (each with its rule) up to this many.
MAX_ZONES = 64
# A failed read of the connect counts is logged at most this often.
LOG_EVERY_S = 60.0


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
        heartbeat_deadline_ms=info.deadline_ms,
    )


class ConnectHealth:
    """The gateways clients cannot connect to, as the fleet's counts show them: this
    process's reports go in with its stats sampler (`reports.counts()`), everyone's come
    back through `counts`, read at each `refresh`."""

    def __init__(
        self,
        counts: CountSums,
        clock: Clock,
        settings: ConnectSettings,
        reports: ConnectReports | None = None,
    ) -> None:
        self._counts = counts
        self._clock = clock
        self.settings = settings
        self.reports = reports or ConnectReports(clock, settings.window_s)
        self.failing: frozenset[str] = frozenset()
        self._line = ThrottledLine(
            log,
            "could not read the clients' connects (dispatch keeps its view): %(exc)s",
            every_s=LOG_EVERY_S,
            now=clock.monotonic,
        )

    def report(self, uid: str, gateway_ids: Sequence[str]) -> None:
        """`uid` could not connect to `gateway_ids` (live gateways)."""
        self.reports.report(uid, gateway_ids)

    async def refresh(self, gateway_ids: Sequence[str]) -> None:
        """Read the last window's connects of `gateway_ids` (the live fleet) and decide
        which are failing; on a failed read the last decision stands."""
        self.reports.retain(gateway_ids)
        if self.settings.min_failures == 0 or not gateway_ids:
            self.failing = frozenset()
            return
        now = self._clock.now_ms()
        names = [p + g for g in gateway_ids for p in (CONNECTS, CONNECT_FAILURES)]
        try:
            counts = await self._counts.sums(now - int(self.settings.window_s * 1000), now, names)
        except ImrouteError as exc:
            self._line.note(exc=exc)
            return
        now_failing = failing(counts, gateway_ids, self.settings)
        for gateway_id in sorted(now_failing - self.failing):
            log.warning(
                "gateway %s skipped by dispatch: %d clients could not connect to it in %.0fs"
                " (%d connects succeeded)",
                gateway_id,
                counts.get(CONNECT_FAILURES + gateway_id, 0),
                self.settings.window_s,
                counts.get(CONNECTS + gateway_id, 0),
            )
        for gateway_id in sorted(self.failing - now_failing):
            log.warning("gateway %s chosen by dispatch again: few failed connects", gateway_id)
        self.failing = now_failing


class Dispatcher:
    """Chooses the gateway a client should connect to, by the configured rule."""

    def __init__(
        self,
        fleet: CachedFleet,
        clock: Clock,
        rule_name: str,
        stats: StatsRegistry | None = None,
        connects: ConnectHealth | None = None,
    ) -> None:
        self._fleet = fleet
        self._connects = connects
        self._available = Availability(clock, stats)
        self._rule_name = rule_name
        # Built now, so a bad IMROUTE_DISPATCH_RULE stops the service at start-up; kept,
        # so round robin's counter carries over from one request to the next.
        self._rule = rule_for(rule_name, self._available)
        self._zoned: dict[str, Rule] = {}
        self._snapshot: list[GatewayInfo] | None = None
        self._placed: Counter[str] = Counter()

    async def choose(
        self, uid: str, zone: str | None = None, avoid: Collection[str] = ()
    ) -> GatewayState:
        """The gateway for `uid`; NoEligibleGateway (a GatewayUnavailable) when none can
        take a connection now. `avoid`: gateways the client could not connect to, taken
        only when no other can take it (ids not in the fleet are ignored)."""
        infos = await self._fleet.live()
        connects = self._connects
        if infos is not self._snapshot:
            self._snapshot = infos
            self._placed.clear()
            if connects is not None:  # once per fleet read; others meanwhile use the last
                await connects.refresh([info.gateway_id for info in infos])
        avoided: frozenset[str] = frozenset()
        if avoid:
            live = {info.gateway_id for info in infos}
            avoided = frozenset(g for g in avoid if g in live)
            if avoided and connects is not None:
                connects.report(uid, sorted(avoided))
        states = [to_state(info, self._placed[info.gateway_id]) for info in infos]
        skipped = connects.failing if connects is not None else frozenset()
        chosen = choose_avoiding(self._rule_for_zone(zone), states, uid, avoided, skipped)
        if chosen is None:
            raise NoEligibleGateway(
                "no gateway can take a connection now (none live, or all draining or full)"
            )
        self._placed[chosen.gateway_id] += 1
        return chosen

    def failing(self) -> frozenset[str]:
        """The gateways it skips now because clients report they cannot connect."""
        return self._connects.failing if self._connects is not None else frozenset()

    def _rule_for_zone(self, zone: str | None) -> Rule:
        if zone is None or not isinstance(self._rule, ZoneAffinityRule):
            return self._rule
        rule = self._zoned.get(zone)
        if rule is None and len(self._zoned) >= MAX_ZONES:
            return self._rule  # unknown zones beyond the cap: no preference
        if rule is None:
            rule = self._zoned[zone] = rule_for(self._rule_name, self._available, zone=zone)
        return rule


def choose_avoiding(
    rule: Rule,
    states: Sequence[GatewayState],
    uid: str,
    avoided: frozenset[str],
    failing: frozenset[str],
) -> GatewayState | None:
    """`rule`'s choice without the `avoided` and `failing` gateways; when none of the
    others can take the client, without the avoided ones only; then among them all (a
    client is better sent to a gateway it failed on than refused with a 503)."""
    if avoided or failing:
        skip = avoided | failing
        chosen = rule.choose([s for s in states if s.gateway_id not in skip], uid)
        if chosen is not None:
            return chosen
        if avoided and failing - avoided:
            chosen = rule.choose([s for s in states if s.gateway_id not in avoided], uid)
            if chosen is not None:
                return chosen
    return rule.choose(states, uid)
