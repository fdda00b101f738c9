"""The GCRA (generic cell rate algorithm) in one Redis script, so that the limit holds
across every push-service process: each bucket is one key holding its theoretical
arrival time (TAT), in microseconds of Redis's own clock (`TIME`), so the processes'
clocks never disagree about it.

A request is allowed when TAT - tolerance <= now; it then moves TAT one emission interval
past max(TAT, now). Refused, it learns how long until TAT - tolerance reaches now. One
round trip and one small key per bucket; the key expires when its bucket is full again.
"""

from __future__ import annotations

from push_service.ratelimit.base import RateLimit
from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from router.redis.scripts import Script, ScriptRunner
from shared.keys import KeySchema

__all__ = ["RedisRateLimiter"]

_GCRA = Script.load(__package__, "gcra")


class RedisRateLimiter:
    """One GCRA bucket per name (e.g. per API key), kept in Redis."""

    def __init__(self, redis: RedisClient, keys: KeySchema, limit: RateLimit) -> None:
        self._keys = keys
        self._limit = limit
        self._argv = (limit.interval_us, (limit.burst - 1) * limit.interval_us)
        self._scripts = ScriptRunner(redis, (_GCRA,))

    @property
    def limit(self) -> RateLimit:
        return self._limit

    @translate_errors
    async def take(self, bucket: str) -> float | None:
        key = self._keys.rate(bucket)
        wait = int(await self._scripts.run(_GCRA, (key,), *self._argv))
        return None if wait <= 0 else wait / 1_000_000
