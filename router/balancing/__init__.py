"""Load balancing's pure core (issue 5): gateway placement and call routing, Ribbon-style.

Rules filter the eligible gateways and pick one; per-gateway stats and circuit breakers
track calls; a retry policy and `execute` run a call with retries and listeners. Nothing
here does I/O: the clock, the sleep and the call are injected.
"""

from __future__ import annotations

from router.balancing.listeners import AttemptInfo, ExecutionContext, ExecutionListener, Listeners
from router.balancing.retry import Decision, Move, NoEligibleGateway, RetryPolicy, execute
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

__all__ = [
    "RULE_NAMES",
    "RULE_SETTING",
    "AttemptInfo",
    "Availability",
    "BreakerState",
    "CircuitBreaker",
    "ConsistentHashRule",
    "Decision",
    "ExecutionContext",
    "ExecutionListener",
    "GatewayState",
    "LeastConnectionsRule",
    "Listeners",
    "Move",
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
    "execute",
    "hrw_score",
    "rule_for",
]
