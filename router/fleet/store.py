"""The gateway fleet in Redis: each gateway announces itself with a heartbeat TTL."""

from __future__ import annotations

from dataclasses import replace

from router.fleet.base import GatewayFleet
from router.fleet.codec import decode_gateway, encode_gateway
from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from shared.clock import Clock
from shared.keys import KeySchema
from shared.models import GatewayInfo

__all__ = ["GatewayFleet", "RedisGatewayFleet"]


class RedisGatewayFleet:
    """Gateway records with a TTL plus a sorted set of their deadlines."""

    def __init__(self, redis: RedisClient, keys: KeySchema, clock: Clock, ttl_s: float) -> None:
        self._redis = redis
        self._keys = keys
        self._clock = clock
        self._ttl_ms = int(ttl_s * 1000)

    @translate_errors
    async def announce(self, info: GatewayInfo) -> bool:
        """Write (or refresh) this gateway's record; False when it was not there before
        (a first announce, a lapse, or Redis lost its data)."""
        now = self._clock.now_ms()
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(
            self._keys.gateway(info.gateway_id),
            encode_gateway(info, heartbeat_ms=now),
            px=self._ttl_ms,
            get=True,
        )
        pipe.zadd(self._keys.gateways(), {info.gateway_id: now + self._ttl_ms})
        pipe.zremrangebyscore(self._keys.gateways(), "-inf", now)
        previous, *_ = await pipe.execute()
        return previous is not None

    @translate_errors
    async def record(self, gateway_id: str) -> tuple[GatewayInfo | None, int]:
        """The gateway's record as announced, and its milliseconds left (0 when none)."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(self._keys.gateway(gateway_id))
        pipe.pttl(self._keys.gateway(gateway_id))
        value, ttl = await pipe.execute()
        info = decode_gateway(value) if value else None
        return info, max(int(ttl), 0) if info is not None else 0

    @translate_errors
    async def withdraw(self, gateway_id: str) -> None:
        """Remove this gateway's record at once (clean shutdown)."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.delete(self._keys.gateway(gateway_id))
        pipe.zrem(self._keys.gateways(), gateway_id)
        await pipe.execute()

    @translate_errors
    async def live(self) -> list[GatewayInfo]:
        """Gateways whose heartbeat has not lapsed, sorted by id."""
        now = self._clock.now_ms()
        scored: list[tuple[str, float]] = await self._redis.zrangebyscore(  # type: ignore[assignment]
            self._keys.gateways(), f"({now}", "+inf", withscores=True
        )
        if not scored:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for gateway_id, _ in scored:
            pipe.get(self._keys.gateway(gateway_id))
        values: list[str | None] = await pipe.execute()
        infos = [
            replace(info, deadline_ms=int(deadline))
            for (_, deadline), v in zip(scored, values, strict=True)
            if v and (info := decode_gateway(v))
        ]
        return sorted(infos, key=lambda i: i.gateway_id)
