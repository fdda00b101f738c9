"""The GCRA (generic cell rate algorithm) in one Redis script, so that the limit holds
across every push-service process: each bucket is one key holding its theoretical
arrival time (TAT), in microseconds of Redis's own clock (`TIME`), so the processes'
clocks never disagree about it.

A request is allowed when TAT - tolerance <= now; it then moves TAT one emission interval
past max(TAT, now). Refused, it learns how long until TAT - tolerance reaches now. One
round trip and one small key per bucket; the key expires when its bucket is full again.
"""

from __future__ import annotations

import hashlib

from redis.exceptions import NoScriptError

from router.ratelimit.base import RateLimit
from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from shared.keys import KeySchema

__all__ = ["RedisRateLimiter"]

_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local allow_at = tat - tolerance
if allow_at > now then
  return allow_at - now
end
local new_tat = tat + interval
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX',
           math.ceil((new_tat - now) / 1000) + 1)
return 0
"""
_SHA = hashlib.sha1(_GCRA.encode()).hexdigest()


class RedisRateLimiter:
    """One GCRA bucket per name (e.g. per API key), kept in Redis."""

    def __init__(self, redis: RedisClient, keys: KeySchema, limit: RateLimit) -> None:
        self._redis = redis
        self._keys = keys
        self._limit = limit
        self._argv = (limit.interval_us, (limit.burst - 1) * limit.interval_us)

    @property
    def limit(self) -> RateLimit:
        return self._limit

    @translate_errors
    async def take(self, bucket: str) -> float | None:
        key = self._keys.rate(bucket)
        try:
            wait_us = await self._redis.execute_command("EVALSHA", _SHA, 1, key, *self._argv)
        except NoScriptError:  # a new or restarted Redis: load the script, then run it
            await self._redis.script_load(_GCRA)
            wait_us = await self._redis.execute_command("EVALSHA", _SHA, 1, key, *self._argv)
        wait = int(wait_us)
        return None if wait <= 0 else wait / 1_000_000
