"""Drain requests: the push service asks a gateway to drain, the gateway's heartbeat sees it.

A request is a key with a TTL rather than a message, so a gateway that is busy or briefly
cut off still finds it at its next heartbeat, and one that never comes back leaves
nothing behind.
"""

from __future__ import annotations

from collections.abc import Mapping

from router.fleet.base import DrainRequests
from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from router.redis.scripts import Script, ScriptRunner
from shared.keys import KeySchema

__all__ = ["DRAIN_REQUEST_TTL_S", "DrainRequests", "RedisDrainRequests"]

# How long a drain request waits for its gateway's next heartbeat to see it.
DRAIN_REQUEST_TTL_S = 60


_TAKE = Script.load(__package__, "take")
_REQUEST_UNLESS_LAST = Script.load(__package__, "request_unless_last")


class RedisDrainRequests:
    """One key per requested drain, ``drain:{gateway_id}`` = the boot it is for (the
    gateway's `started_ms`), expiring after a minute unless taken first."""

    def __init__(
        self, redis: RedisClient, keys: KeySchema, ttl_s: int = DRAIN_REQUEST_TTL_S
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._ttl_s = ttl_s
        self._scripts = ScriptRunner(redis, (_TAKE, _REQUEST_UNLESS_LAST))

    @translate_errors  # Redis down: RegistryUnavailable (a 503 at the API)
    async def request(self, gateway_id: str, boot_ms: int) -> None:
        await self._redis.set(self._keys.drain(gateway_id), str(boot_ms), ex=self._ttl_s)

    @translate_errors
    async def request_unless_last(
        self, gateway_id: str, boot_ms: int, others: Mapping[str, int]
    ) -> bool:
        keys = [self._keys.drain(gateway_id), *(self._keys.drain(g) for g in others)]
        args = [str(self._ttl_s), str(boot_ms), *(str(b) for b in others.values())]
        return bool(await self._scripts.run(_REQUEST_UNLESS_LAST, keys, *args))

    @translate_errors
    async def take(self, gateway_id: str, boot_ms: int) -> bool:
        key = self._keys.drain(gateway_id)
        return bool(await self._scripts.run(_TAKE, (key,), str(boot_ms)))
