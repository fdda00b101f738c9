"""Health and metrics: whether Redis answers, and the Prometheus scrape."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from router.redis.client import RedisClient, ping

__all__ = ["Health"]


class Health:
    """What /healthz and /metrics report."""

    def __init__(self, redis: RedisClient, metrics: CollectorRegistry) -> None:
        self._redis = redis
        self._metrics = metrics

    async def redis_answers(self) -> bool:
        """True when Redis answers a ping."""
        return await ping(self._redis)

    def scrape(self) -> bytes:
        """Prometheus metrics: publishing (and hedging) per topic, calls per gateway."""
        return generate_latest(self._metrics)
