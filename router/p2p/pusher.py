"""The P2P path: resolve routes, one concurrent Deliver call per gateway, merge answers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from router.fleet.cache import CachedFleet
from router.gateway_rpc.base import GatewayClient
from router.p2p.plan import GatewayOutcome, PushOutcome, Target, merge, plan_p2p
from router.routes.base import RouteRegistry
from shared.batches import to_batch
from shared.errors import GatewayUnavailable, RegistryUnavailable
from shared.ids import new_id
from shared.models import Message, Route

__all__ = ["P2PPusher"]

log = logging.getLogger(__name__)

# A route of an unknown gateway makes the push re-read the fleet if the cached copy is
# older than this.
STALE_RECHECK_S = 0.25


class P2PPusher:
    """Pushes one message to a list of users wherever they are connected."""

    def __init__(
        self,
        registry: RouteRegistry,
        fleet: CachedFleet,
        clients: GatewayClient,
        deliver_timeout_s: float,
    ) -> None:
        self._registry = registry
        self._fleet = fleet
        self._clients = clients
        self._timeout = deliver_timeout_s

    async def push(self, message: Message, uids: Sequence[str], expires_ms: int = 0) -> PushOutcome:
        routes = await self._registry.lookup(uids)
        plan = plan_p2p(uids, routes, await self._live())
        if plan.stale and self._fleet.age() > STALE_RECHECK_S:
            # The cache may predate a gateway that just started: ask Redis once more (but
            # not on every push while a dead gateway's routes are still expiring).
            self._fleet.invalidate()
            plan = plan_p2p(uids, routes, await self._live())
        outcomes = await asyncio.gather(
            *(self._deliver(message, target, expires_ms) for target in plan.targets.values())
        )
        outcome = merge(uids, plan, outcomes)
        if any(o.suspect for o in outcome.errors) and self._fleet.age() > STALE_RECHECK_S:
            # A failing gateway may have died since the fleet was cached: read it again,
            # but not on every push while a sick gateway keeps failing.
            self._fleet.invalidate()
        # Routes of gateways missing from the fleet are skipped, not deleted: they expire
        # by their own deadline, and a gateway that merely missed a heartbeat keeps them.
        await self._forget(outcome.gone)
        return outcome

    async def _live(self) -> dict[str, str]:
        return {g.gateway_id: g.grpc_address for g in await self._fleet.live()}

    async def _deliver(self, message: Message, target: Target, expires_ms: int) -> GatewayOutcome:
        batch = to_batch(message, target.uids, new_id())
        batch.expires_ms = expires_ms
        try:
            reply = await self._clients.deliver(
                target.gateway_id, target.address, batch, self._timeout
            )
        except GatewayUnavailable as exc:
            # Logged where it happened: by the call listeners (per RPC), the coalescer
            # (queued too long) or the circuit (when it opened).
            log.debug("deliver to %s failed: %s", target.gateway_id, exc.reason)
            suspect = exc.code == "UNAVAILABLE"
            return GatewayOutcome(target.gateway_id, error=exc.reason, suspect=suspect)
        if reply.expired:
            return GatewayOutcome(target.gateway_id, error="EXPIRED: arrived after its ttl_s")
        if reply.duplicate and not reply.delivered and not reply.missing:
            # A retry of a batch the gateway wrote, whose first answer it no longer holds
            # (its reply cache is bounded): the batch went out, so report its recipients
            # delivered, though some may have been missing. Rare enough to log.
            log.warning(
                "deliver to %s: a retried batch's first answer is gone; reporting its "
                "%d recipients delivered",
                target.gateway_id,
                len(target.uids),
            )
            return GatewayOutcome(target.gateway_id, target.uids, ())
        return GatewayOutcome(target.gateway_id, reply.delivered, reply.missing)

    async def _forget(self, routes: Sequence[Route]) -> None:
        """Delete routes their own gateway disowned; the push has its answer, so only log."""
        if not routes:
            return
        try:
            await self._registry.remove(routes)
        except RegistryUnavailable as exc:
            log.warning("could not remove %d stale routes: %s", len(routes), exc)
