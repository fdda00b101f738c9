"""Health and metrics: whether Redis answers, and the Prometheus scrape."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest

__all__ = ["Health"]


class Siblings(Protocol):
    """The other workers of this push service (push_service.worker.Worker)."""

    async def scrape_all(self, own: bytes) -> bytes: ...


class Health:
    """What /healthz and /metrics report."""

    def __init__(
        self,
        ping: Callable[[], Awaitable[bool]],
        metrics: CollectorRegistry,
        siblings: Siblings | None = None,
    ) -> None:
        self._ping = ping
        self._metrics = metrics
        self.siblings = siblings  # with IMROUTE_WORKERS > 1: /metrics answers for all

    async def redis_answers(self) -> bool:
        """True when Redis answers a ping (a Redis Cluster: and serves every slot)."""
        return await self._ping()

    def own_scrape(self) -> bytes:
        """This process's Prometheus metrics."""
        return generate_latest(self._metrics)

    async def scrape(self) -> bytes:
        """Prometheus metrics: publishing (and hedging) per topic, calls per gateway; of
        every worker, each sample labelled with its own, when there are several."""
        own = self.own_scrape()
        return own if self.siblings is None else await self.siblings.scrape_all(own)
