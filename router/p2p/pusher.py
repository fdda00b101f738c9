"""The P2P path: log the message into each recipient's log and inbox (where it stays
until a device acks it), resolve routes, one concurrent Deliver call per gateway, merge
the answers, and record the push's receipt."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from router.fleet.cache import CachedFleet
from router.gateway_rpc.base import GatewayClient
from router.p2p.plan import GatewayOutcome, PushOutcome, Target, merge, plan_p2p
from router.recovery.base import RecoveryLog
from router.routes.base import RouteRegistry
from shared.batches import to_batch
from shared.clock import Clock, SystemClock
from shared.errors import GatewayUnavailable, ImrouteError, RegistryUnavailable
from shared.ids import new_id
from shared.models import Message, Route

__all__ = ["P2PPusher", "deliver_expiry_ms"]

log = logging.getLogger(__name__)

# A route of an unknown gateway makes the push re-read the fleet if the cached copy is
# older than this.
STALE_RECHECK_S = 0.25
# When a push that failed for a connected recipient is tried again (seconds after the
# previous try): past a circuit breaker's cool-off (IMROUTE_CIRCUIT_COOL_OFF_S, 10 s).
RETRY_AFTER_S = (1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 8.0, 8.0, 16.0)  # 46 s in all
MAX_RETRYING = 10_000  # pushes being retried at once; beyond, the inbox alone keeps them
# Every P2P batch expires by the end of its call (`deliver_expiry_ms`), this much early:
# the gateways' clocks may be a little ahead of ours (NTP keeps them far closer).
CLOCK_MARGIN_MS = 250


class P2PPusher:
    """Pushes one message to a list of users wherever they are connected."""

    def __init__(
        self,
        registry: RouteRegistry,
        fleet: CachedFleet,
        clients: GatewayClient,
        deliver_timeout_s: float,
        recovery: RecoveryLog | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._registry = registry
        self._clock = clock or SystemClock()
        self._fleet = fleet
        self._clients = clients
        self._timeout = deliver_timeout_s
        self._recovery = recovery
        self.inbox_dropped = 0  # entries the inbox bound (IMROUTE_INBOX_MAX) pushed out
        # Queued for a user whose gateway failed: the user may well be connected (a
        # gateway back from a restart while its circuit is still open), and the inbox is
        # read only when a connection starts. So the push is tried again, in the background.
        self._retrying: set[asyncio.Task[None]] = set()
        self.retried = 0  # recipients a later try reached
        # Told of the recipients a background retry reached (their push's receipt).
        self.on_retried: Callable[[str, Sequence[str]], Awaitable[None]] | None = None

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
            # Both at once (one task, not gather's two: this is the hottest path).
            appending = asyncio.ensure_future(recovery.append_queued(message, uids, expires_ms))
            try:
                routes = await self._registry.lookup(uids)
            except BaseException:
                # As gather would: the append goes on; its outcome is not ours to wait for.
                appending.add_done_callback(_consume)
                raise
            logged, dropped = await appending
            seqs = dict(zip(uids, logged, strict=True))
            if dropped:
                self.inbox_dropped += dropped
                log.info("inbox full: dropped the %d oldest entries (IMROUTE_INBOX_MAX)", dropped)
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
        targets = list(plan.targets.values())
        if len(targets) == 1:  # the usual P2P push: no gather, no task
            outcomes = [await self._deliver(message, targets[0], expires_ms, seqs)]
        else:
            outcomes = await asyncio.gather(
                *(self._deliver(message, t, expires_ms, seqs) for t in targets)
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
        """For whoever it reached no connection of (it waits in their inbox): look once
        more, for a client that connected (and read its inbox, maybe before the message
        was in it) while this push was on its way; retry the failed in the background."""
        waiting = [*outcome.offline, *outcome.failed]
        # Only the offline: a failed gateway would fail again, and cost another timeout.
        late: set[str] = set()
        if outcome.offline:
            reached = await self._redeliver(recovery, message, outcome.offline, expires_ms, seqs)
            late = set(reached or ())
        if outcome.failed and len(self._retrying) < MAX_RETRYING:
            task = asyncio.create_task(
                self._retry(recovery, message, list(outcome.failed), expires_ms, dict(seqs))
            )
            self._retrying.add(task)
            task.add_done_callback(self._retrying.discard)
        if not late:
            return dataclasses.replace(outcome, queued=waiting)
        return dataclasses.replace(
            outcome,
            delivered=[*outcome.delivered, *(u for u in waiting if u in late)],
            offline=[u for u in outcome.offline if u not in late],
            failed=[u for u in outcome.failed if u not in late],
            queued=[u for u in waiting if u not in late],
        )

    async def _retry(
        self,
        recovery: RecoveryLog,
        message: Message,
        uids: list[str],
        expires_ms: int,
        seqs: Mapping[str, int],
    ) -> None:
        """Deliver a queued push to failed recipients again, until it reaches them (and
        leaves their inbox), it expires, or RETRY_AFTER_S runs out. A recipient that
        reconnects meanwhile gets it from the inbox; its gateway then writes it once."""
        # Its age from the loop's clock (no wall clock here): never delivered past ttl_s.
        waited = 0.0
        for delay in RETRY_AFTER_S:
            await asyncio.sleep(delay)
            waited += delay
            if not uids or (expires_ms and message.ts_ms + waited * 1000 > expires_ms):
                return
            try:
                reached = await self._redeliver(recovery, message, uids, expires_ms, seqs)
            except ImrouteError as exc:
                log.debug("retrying a queued push failed: %s", exc)
                continue
            if reached is None:
                return  # offline now: the inbox has it for their next connection
            self.retried += len(reached)
            if reached and self.on_retried is not None:
                try:
                    await self.on_retried(message.push_id, reached)
                except ImrouteError as exc:
                    log.warning("could not record a retried push's delivery: %s", exc)
            done = set(reached)
            uids = [u for u in uids if u not in done]

    async def _redeliver(
        self,
        recovery: RecoveryLog,
        message: Message,
        uids: Sequence[str],
        expires_ms: int,
        seqs: Mapping[str, int],
    ) -> list[str] | None:
        """Deliver a queued push again to those of `uids` with a live route now (it stays
        in their inboxes until a device acks it). None: none has a route."""
        routes = await self._registry.lookup(uids)
        if not routes:
            return None
        again = await self._deliver_all(message, list(routes), routes, expires_ms, seqs)
        return list(again.delivered)

    async def aclose(self) -> None:
        """Stop the background retries (what they carry stays in the inboxes)."""
        for task in list(self._retrying):
            task.cancel()
        await asyncio.gather(*self._retrying, return_exceptions=True)

    async def _live(self) -> dict[str, str]:
        return {g.gateway_id: g.grpc_address for g in await self._fleet.live()}

    async def _deliver(
        self, message: Message, target: Target, expires_ms: int, seqs: Mapping[str, int]
    ) -> GatewayOutcome:
        batch = to_batch(message, target.uids, new_id())
        batch.expires_ms = deliver_expiry_ms(expires_ms, self._clock.now_ms(), self._timeout)
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
            return GatewayOutcome(
                target.gateway_id,
                error="EXPIRED: reached the gateway after its ttl_s or the call's deadline; "
                "not written",
            )
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


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def deliver_expiry_ms(expires_ms: int, now_ms: int, timeout_s: float) -> int:
    """When the gateway must stop writing a P2P batch sent now: at its ttl_s (`expires_ms`,
    0 for none) or at the call's deadline, whichever comes first. Past the deadline the
    caller has been told `failed`; a gateway that writes it later would make that a lie."""
    margin = min(CLOCK_MARGIN_MS, int(timeout_s * 250))  # a quarter of short timeouts
    deadline = now_ms + int(timeout_s * 1000) - margin
    return min(expires_ms, deadline) if expires_ms else deadline
