"""Routing logic, one package per stage of the data path (see the README's architecture):

`p2p` (plan and pusher), `routes` (the Userinfo store), `gateway_rpc` (the gRPC client
stack), `fanout` (broadcast and multicast batches), `bus` (transports), `hedging`,
`balancing` (pure rules, stats, circuits), `fleet` (gateway records, dispatch, drains),
`directory` (SQL users), `jobs`, `redis` (client and error mapping), `devtools`, `cli`.
"""

from __future__ import annotations

from router.fleet.cache import CachedFleet
from router.fleet.store import GatewayFleet, RedisGatewayFleet
from router.gateway_rpc.grpc_client import GatewayClient, GrpcGatewayClients
from router.hedging import Hedger, HedgingSettings, RetrySettings
from router.p2p.plan import DeliveryPlan, PushOutcome, merge, plan_p2p
from router.p2p.pusher import P2PPusher
from router.routes.registry import LOOKUP_CHUNK, RedisRouteRegistry, Registration, RouteRegistry

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
