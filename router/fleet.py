"""The gateway fleet in Redis: each gateway announces itself with a heartbeat TTL."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Protocol

from router.redis_client import RedisClient, translate_errors
from shared.clock import Clock
from shared.keys import KeySchema, decode_gateway, encode_gateway
from shared.models import GatewayInfo

__all__ = ["CachedFleet", "GatewayFleet", "RedisGatewayFleet"]

log = logging.getLogger(__name__)


class GatewayFleet(Protocol):
    async def announce(self, info: GatewayInfo) -> bool: ...
    async def withdraw(self, gateway_id: str) -> None: ...
    async def live(self) -> list[GatewayInfo]: ...


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
            self._keys.gateway(info.gateway_id), encode_gateway(info), px=self._ttl_ms, get=True
        )
        pipe.zadd(self._keys.gateways(), {info.gateway_id: now + self._ttl_ms})
        pipe.zremrangebyscore(self._keys.gateways(), "-inf", now)
        previous, *_ = await pipe.execute()
        return previous is not None

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


class CachedFleet:
    """A short-lived local cache in front of a fleet, so hot paths do not ask Redis each time.

    Refreshes are single-flight: when the cache expires under load, one read goes to
    Redis and every caller waiting meanwhile shares its answer. `on_change` hears the
    live gateways (id -> gRPC address) after each read from Redis.
    """

    def __init__(
        self,
        fleet: GatewayFleet,
        clock: Clock,
        max_age_s: float,
        on_change: Callable[[Mapping[str, str]], None] | None = None,
    ) -> None:
        self._fleet = fleet
        self._clock = clock
        self._max_age = max_age_s
        self._on_change = on_change
        self._cached: list[GatewayInfo] | None = None
        self.reads = 0  # reads from the fleet behind the cache
        self._at = 0.0
        self._refresh: asyncio.Future[list[GatewayInfo]] | None = None

    async def live(self) -> list[GatewayInfo]:
        if self._cached is not None and self._clock.monotonic() - self._at < self._max_age:
            return self._cached
        if self._refresh is None:
            self._refresh = asyncio.ensure_future(self._read())
        # shield: one caller giving up must not cancel the read the others share.
        return await asyncio.shield(self._refresh)

    async def _read(self) -> list[GatewayInfo]:
        try:
            started = self._clock.monotonic()
            self.reads += 1
            fresh = await self._fleet.live()
            self._cached, self._at = fresh, started
            self._notify(fresh)
            return fresh
        finally:
            self._refresh = None

    def _notify(self, fresh: list[GatewayInfo]) -> None:
        if self._on_change is None:
            return
        try:
            # On every read, not only on a change: what was kept for a departed gateway
            # may be re-created by a call planned before it left, or be kept on purpose
            # for a while (an open circuit), and must still go.
            self._on_change({g.gateway_id: g.grpc_address for g in fresh})
        except Exception:  # a listener's bug must not fail the read
            log.exception("fleet change listener failed")

    def age(self) -> float:
        """Seconds since the cached copy was read (infinite when there is none)."""
        if self._cached is None:
            return float("inf")
        return self._clock.monotonic() - self._at

    def invalidate(self) -> None:
        self._cached = None
