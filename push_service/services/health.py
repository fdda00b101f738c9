"""Health and metrics: whether Redis answers, and the Prometheus scrape."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry, generate_latest

__all__ = ["Health"]


class Health:
    """What /healthz and /metrics report."""

    def __init__(self, ping: Callable[[], Awaitable[bool]], metrics: CollectorRegistry) -> None:
        self._ping = ping
        self._metrics = metrics

    async def redis_answers(self) -> bool:
        """True when Redis answers a ping."""
        return await self._ping()

    def scrape(self) -> bytes:
        """Prometheus metrics: publishing (and hedging) per topic, calls per gateway."""
        return generate_latest(self._metrics)
