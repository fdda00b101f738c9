"""Routing logic, one package per stage of the data path (see the README's architecture):

`p2p` (plan and pusher), `routes` (the Userinfo store), `gateway_rpc` (the gRPC client
stack), `fanout` (broadcast and multicast batches), `bus` (transports), `hedging`,
`balancing` (pure rules, stats, circuits), `fleet` (gateway records, dispatch, drains),
`directory` (SQL users), `jobs`, `redis` (client and error mapping), `devtools`, `cli`,
and `testing` (the shared test doubles).

The names below stay importable from `router` itself, but are loaded on first use, so
importing one pure module (say `router.fanout.batcher`) does not load Redis or gRPC.
"""

from __future__ import annotations

import importlib
from typing import Any

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

_HOME = {
    "LOOKUP_CHUNK": "router.routes.registry",
    "CachedFleet": "router.fleet.cache",
    "DeliveryPlan": "router.p2p.plan",
    "GatewayClient": "router.gateway_rpc.grpc_client",
    "GatewayFleet": "router.fleet.store",
    "GrpcGatewayClients": "router.gateway_rpc.grpc_client",
    "Hedger": "router.hedging",
    "HedgingSettings": "router.hedging",
    "P2PPusher": "router.p2p.pusher",
    "PushOutcome": "router.p2p.plan",
    "RedisGatewayFleet": "router.fleet.store",
    "RedisRouteRegistry": "router.routes.registry",
    "Registration": "shared.models",
    "RetrySettings": "router.hedging",
    "RouteRegistry": "router.routes.registry",
    "merge": "router.p2p.plan",
    "plan_p2p": "router.p2p.plan",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'router' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
