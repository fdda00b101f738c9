"""The P2P path: log the message, resolve routes, one concurrent Deliver call per gateway,
merge the answers, and put what reached nobody into the recipients' inboxes."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence

from router.fleet.cache import CachedFleet
from router.gateway_rpc.base import GatewayClient
from router.p2p.plan import GatewayOutcome, PushOutcome, Target, merge, plan_p2p
from router.recovery.base import RecoveryLog
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
        recovery: RecoveryLog | None = None,
    ) -> None:
        self._registry = registry
        self._fleet = fleet
        self._clients = clients
        self._timeout = deliver_timeout_s
        self._recovery = recovery
        self.inbox_dropped = 0  # entries the inbox bound (IMROUTE_INBOX_MAX) pushed out

    async def push(
        self, message: Message, uids: Sequence[str], expires_ms: int = 0, store: bool = True
    ) -> PushOutcome:
        """Deliver `message` to each uid's live connections. Stored (the default, with a
        recovery log): logged first, so a resuming client can get it again, and queued in
        the inbox of each recipient it reached no connection of."""
        recovery = self._recovery if store else None
        seqs: dict[str, int] = {}
        if recovery is None:
            routes = await self._registry.lookup(uids)
        else:
            # Logged before any gateway can write it: a replay never misses a live push.
            routes, logged = await asyncio.gather(
                self._registry.lookup(uids), recovery.append_p2p(message, uids, expires_ms)
            )
            seqs = dict(zip(uids, logged, strict=True))
        outcome = await self._deliver_all(message, uids, routes, expires_ms, seqs)
        if recovery is not None and (outcome.offline or outcome.failed):
            outcome = await self._queue(recovery, message, outcome, expires_ms, seqs)
        return outcome

    async def _deliver_all(
        self,
        message: Message,
        uids: Sequence[str],
        routes: Mapping[str, Sequence[Route]],
        expires_ms: int,
        seqs: Mapping[str, int],
    ) -> PushOutcome:
        plan = plan_p2p(uids, routes, await self._live())
        if plan.stale and self._fleet.age() > STALE_RECHECK_S:
            # The cache may predate a gateway that just started: ask Redis once more (but
            # not on every push while a dead gateway's routes are still expiring).
            self._fleet.invalidate()
            plan = plan_p2p(uids, routes, await self._live())
        outcomes = await asyncio.gather(
            *(self._deliver(message, t, expires_ms, seqs) for t in plan.targets.values())
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

    async def _queue(
        self,
        recovery: RecoveryLog,
        message: Message,
        outcome: PushOutcome,
        expires_ms: int,
        seqs: Mapping[str, int],
    ) -> PushOutcome:
        """Queue the message for whoever it reached no connection of; then look once more,
        for a client that connected (and read its inbox) while this push was on its way."""
        waiting = [*outcome.offline, *outcome.failed]
        dropped = await recovery.queue(message, expires_ms, {u: seqs[u] for u in waiting})
        if dropped:
            self.inbox_dropped += dropped
            log.info("inbox full: dropped the %d oldest entries (IMROUTE_INBOX_MAX)", dropped)
        # Only the offline: a failed gateway would fail again, and cost another timeout.
        routes = await self._registry.lookup(outcome.offline) if outcome.offline else {}
        late: set[str] = set()
        if routes:
            again = await self._deliver_all(message, list(routes), routes, expires_ms, seqs)
            late = set(again.delivered)
            for uid in again.delivered:
                await recovery.forget_inbox(uid, [seqs[uid]])
        if not late:
            return dataclasses.replace(outcome, queued=waiting)
        return dataclasses.replace(
            outcome,
            delivered=[*outcome.delivered, *(u for u in waiting if u in late)],
            offline=[u for u in outcome.offline if u not in late],
            failed=[u for u in outcome.failed if u not in late],
            queued=[u for u in waiting if u not in late],
        )

    async def _live(self) -> dict[str, str]:
        return {g.gateway_id: g.grpc_address for g in await self._fleet.live()}

    async def _deliver(
        self, message: Message, target: Target, expires_ms: int, seqs: Mapping[str, int]
    ) -> GatewayOutcome:
        batch = to_batch(message, target.uids, new_id())
        batch.expires_ms = expires_ms
        if seqs:
            batch.seqs.extend([seqs[uid] for uid in target.uids])
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
