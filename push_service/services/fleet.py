"""The gateway fleet as callers see it: who is live, and asking one to drain."""

from __future__ import annotations

from push_service.errors import Conflict, NotFound
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

    async def drain(self, gateway_id: str, force: bool = False) -> None:
        """Ask a live gateway to drain (it sees it at its next heartbeat); NotFound if none.
        Conflict if it is the last of its group not draining nor asked to, unless `force`."""
        live = await self.live()
        record = next((g for g in live if g.gateway_id == gateway_id), None)
        if record is None:
            raise NotFound(f"no live gateway {gateway_id!r}")
        if record.draining:
            return  # already under way: asking again would change nothing
        # For this boot only: a restart (same id) is not drained by an old request.
        if force:
            await self._drains.request(gateway_id, record.started_ms)
            return
        others = {
            g.gateway_id: g.started_ms
            for g in live
            if g.group_id == record.group_id and g.gateway_id != gateway_id and not g.draining
        }
        if not await self._drains.request_unless_last(gateway_id, record.started_ms, others):
            raise Conflict(
                f"{gateway_id!r} is the last gateway of group {record.group_id!r} that is "
                "not draining: draining it would leave the group no gateway that takes "
                "clients. Start another in the group first, or add ?force=true"
            )
