"""Load balancing's pure core: gateway placement and call routing, Ribbon-style.

- `rules`: an Availability filter, then a rule picks one gateway (round robin, least
  connections, rendezvous consistent hash by group, zone affinity).
- `stats`: per-gateway call counters, each with its circuit breaker.
- `connects`: clients' failed and successful connects, and which gateways they show
  failing (dispatch skips those).
- `retry`: how often a pinned call is retried on its gateway, and the backoff.

Nothing here does I/O: the clock is injected. `router.fleet.dispatch` applies the rules
to the live fleet; `router.gateway_rpc.client` runs calls through stats and retries.
"""

from __future__ import annotations

from router.balancing.connects import ConnectReports, ConnectSettings, failing
from router.balancing.retry import RetryPolicy
from router.balancing.rules import (
    RULE_NAMES,
    RULE_SETTING,
    Availability,
    ConsistentHashRule,
    LeastConnectionsRule,
    RoundRobinRule,
    Rule,
    ZoneAffinityRule,
    hrw_score,
    rule_for,
)
from router.balancing.servers import GatewayState
from router.balancing.stats import (
    BreakerState,
    CircuitBreaker,
    Permit,
    ServerStats,
    StatsRegistry,
    StatsSettings,
    Ticket,
)
from shared.errors import NoEligibleGateway

__all__ = [
    "RULE_NAMES",
    "RULE_SETTING",
    "Availability",
    "BreakerState",
    "CircuitBreaker",
    "ConnectReports",
    "ConnectSettings",
    "ConsistentHashRule",
    "GatewayState",
    "LeastConnectionsRule",
    "NoEligibleGateway",
    "Permit",
    "RetryPolicy",
    "RoundRobinRule",
    "Rule",
    "ServerStats",
    "StatsRegistry",
    "StatsSettings",
    "Ticket",
    "ZoneAffinityRule",
    "failing",
    "hrw_score",
    "rule_for",
]
