"""Drain requests: the push service asks a gateway to drain, the gateway's heartbeat sees it.

A request is a key with a TTL rather than a message, so a gateway that is busy or briefly
cut off still finds it at its next heartbeat, and one that never comes back leaves
nothing behind.
"""

from __future__ import annotations

from router.fleet.base import DrainRequests
from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from shared.keys import KeySchema

__all__ = ["DRAIN_REQUEST_TTL_S", "DrainRequests", "RedisDrainRequests"]

# How long a drain request waits for its gateway's next heartbeat to see it.
DRAIN_REQUEST_TTL_S = 60


class RedisDrainRequests:
    """One key per requested drain, ``drain:{gateway_id}``, expiring after a minute."""

    def __init__(
        self, redis: RedisClient, keys: KeySchema, ttl_s: int = DRAIN_REQUEST_TTL_S
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._ttl_s = ttl_s

    @translate_errors  # Redis down: RegistryUnavailable (a 503 at the API)
    async def request(self, gateway_id: str) -> None:
        await self._redis.set(self._keys.drain(gateway_id), "1", ex=self._ttl_s)

    @translate_errors
    async def requested(self, gateway_id: str) -> bool:
        return bool(await self._redis.exists(self._keys.drain(gateway_id)))
