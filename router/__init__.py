"""Routing logic: Userinfo registry and look-ups, planning, and the gateway client."""

from __future__ import annotations

from router.fleet import CachedFleet, GatewayFleet, RedisGatewayFleet
from router.gateway_client import GatewayClient, GrpcGatewayClients
from router.hedging import Hedger, HedgingSettings, RetrySettings
from router.p2p import P2PPusher
from router.planning import DeliveryPlan, PushOutcome, merge, plan_p2p
from router.registry import LOOKUP_CHUNK, RedisRouteRegistry, Registration, RouteRegistry

__all__ = [
    "LOOKUP_CHUNK",
    "CachedFleet",
    "DeliveryPlan",
    "GatewayClient",
    "GatewayFleet",
    "GrpcGatewayClients",
    "Hedger",
    "HedgingSettings",
    "P2PPusher",
    "PushOutcome",
    "RedisGatewayFleet",
    "RedisRouteRegistry",
    "Registration",
    "RetrySettings",
    "RouteRegistry",
    "merge",
    "plan_p2p",
]
