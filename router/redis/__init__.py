"""Redis for the route store, the fleet, the jobs and the Streams bus: one client factory
and one mapping of redis-py's errors into ours."""

from router.redis.client import RedisClient, connect_redis, create_redis, ping
from router.redis.errors import (
    is_unreachable,
    redis_errors,
    reraise_swallowed_cancel,
    translate_errors,
)

__all__ = [
    "RedisClient",
    "connect_redis",
    "create_redis",
    "is_unreachable",
    "ping",
    "redis_errors",
    "reraise_swallowed_cancel",
    "translate_errors",
]
