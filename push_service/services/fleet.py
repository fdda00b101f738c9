"""The gateway fleet as callers see it: who is live, and asking one to drain."""

from __future__ import annotations

from push_service.errors import NotFound
from router.fleet.base import DrainRequests
from router.fleet.cache import CachedFleet
from shared.models import GatewayInfo

__all__ = ["Fleet"]


class Fleet:
    """Reads the fleet afresh (not the dispatch cache) and files drain requests."""

    def __init__(self, fleet: CachedFleet, drains: DrainRequests) -> None:
        self._fleet = fleet
        self._drains = drains

    async def live(self) -> list[GatewayInfo]:
        """The live gateways, as their heartbeats announce them."""
        self._fleet.invalidate()
        return await self._fleet.live()

    async def drain(self, gateway_id: str) -> None:
        """Ask a live gateway to drain (it sees it at its next heartbeat); NotFound if none."""
        record = next((g for g in await self.live() if g.gateway_id == gateway_id), None)
        if record is None:
            raise NotFound(f"no live gateway {gateway_id!r}")
        # For this boot only: a restart (same id) is not drained by an old request.
        await self._drains.request(gateway_id, record.started_ms)
