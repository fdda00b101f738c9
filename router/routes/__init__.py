"""The Userinfo store: where each live connection of a user is, in Redis.

- `codec`: a route's value, written by the gateway and read by every look-up.
- `registry`: register, refresh and remove routes; look them up for P2P and multicast.
- `reads` and `bulk_read`: many route hashes in one round trip.
- `writer`: coalesces a gateway's concurrent route writes into pipelines.
"""

from router.routes.codec import decode_route, encode_route, group_live_routes
from router.routes.registry import (
    LOOKUP_CHUNK,
    RedisRouteRegistry,
    Registration,
    RouteRegistry,
)
from router.routes.writer import CoalescingRouteWriter

__all__ = [
    "LOOKUP_CHUNK",
    "CoalescingRouteWriter",
    "RedisRouteRegistry",
    "Registration",
    "RouteRegistry",
    "decode_route",
    "encode_route",
    "group_live_routes",
]
