"""The gateway fleet: records gateways announce, the cached copy hot paths read, drain
requests, and dispatch (placing a connecting client on a gateway)."""

from router.fleet.cache import CachedFleet
from router.fleet.codec import decode_gateway, encode_gateway
from router.fleet.dispatch import Dispatcher
from router.fleet.drain import DrainRequests, RedisDrainRequests
from router.fleet.store import GatewayFleet, RedisGatewayFleet

__all__ = [
    "CachedFleet",
    "Dispatcher",
    "DrainRequests",
    "GatewayFleet",
    "RedisDrainRequests",
    "RedisGatewayFleet",
    "decode_gateway",
    "encode_gateway",
]
