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
from router.p2p.delivery import CLOCK_MARGIN_MS, Delivery, deliver_expiry_ms
from router.p2p.plan import Outgoing, PushOutcome
from router.recovery.base import RecoveryLog
from router.routes.base import RouteRegistry
from shared.clock import Clock, SystemClock
from shared.errors import ImrouteError
from shared.models import Message, Route
from shared.tracing import Tracer, leaf_span, traced

__all__ = ["CLOCK_MARGIN_MS", "P2PPusher", "deliver_expiry_ms"]

log = logging.getLogger(__name__)

# When a push that failed for a connected recipient is tried again (seconds after the
# previous try): past a circuit breaker's cool-off (IMROUTE_CIRCUIT_COOL_OFF_S, 10 s).
RETRY_AFTER_S = (1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 8.0, 8.0, 16.0)  # 46 s in all
MAX_RETRYING = 10_000  # pushes being retried at once; beyond, the inbox alone keeps them


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
        tracer: Tracer | None = None,
    ) -> None:
        """`tracer`: tracing on (shared.tracing), each look-up and gateway call a span."""
        self._registry = registry
        self._clients = clients  # the stack every P2P call goes through
        self._recovery = recovery
        self._tracer = tracer
        self._delivery = Delivery(
            registry, fleet, clients, deliver_timeout_s, clock or SystemClock(), tracer
        )
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
            routes = await self._lookup(uids)
        else:
            # Logged before any gateway can write it: a replay never misses a live push.
            # Both at once (one task, not gather's two: this is the hottest path).
            appending = asyncio.ensure_future(recovery.append_queued(message, uids, expires_ms))
            try:
                routes = await self._lookup(uids)
            except BaseException:
                # As gather would: the append goes on; its outcome is not ours to wait for.
                appending.add_done_callback(_consume)
                raise
            logged, dropped = await appending
            seqs = dict(zip(uids, logged, strict=True))
            self._dropped(dropped)
        outcome = await self._delivery.deliver(message, uids, routes, expires_ms, seqs)
        if recovery is not None and (outcome.offline or outcome.failed):
            outcome = await self._queue(recovery, message, outcome, expires_ms, seqs)
        return outcome

    async def push_many(self, items: Sequence[Outgoing]) -> list[PushOutcome | ImrouteError]:
        """`push` for many messages at once, as the batch endpoint sends them: one
        log-and-inbox write for all the stored ones, one look-up for all their
        recipients, each gateway's deliveries sent together. Each message's outcome, or
        the error that failed it alone; an error that fails them all is raised."""
        recovery = self._recovery
        stored = [i for i, item in enumerate(items) if item.store] if recovery else []
        seqs: list[dict[str, int]] = [{} for _ in items]
        uids = list(dict.fromkeys(u for item in items for u in item.uids))
        if recovery is None or not stored:
            routes = await self._lookup(uids)
        else:
            wanted = [(items[i].message, items[i].uids, items[i].expires_ms) for i in stored]
            appending = asyncio.ensure_future(recovery.append_queued_many(wanted))
            try:
                routes = await self._lookup(uids)
            except BaseException:
                appending.add_done_callback(_consume)
                raise
            dropped = 0
            for i, (logged, over) in zip(stored, await appending, strict=True):
                seqs[i] = dict(zip(items[i].uids, logged, strict=True))
                dropped += over
            self._dropped(dropped)
        delivered = await self._delivery.deliver_many(items, routes, seqs)
        outcomes: list[PushOutcome | ImrouteError] = list(delivered)
        if recovery is None:
            return outcomes
        waiting = [i for i, o in enumerate(delivered) if items[i].store and (o.offline or o.failed)]
        queued = await asyncio.gather(
            *(self._queued(recovery, items[i], delivered[i], seqs[i]) for i in waiting)
        )
        for i, outcome in zip(waiting, queued, strict=True):
            outcomes[i] = outcome
        return outcomes

    async def _queued(
        self,
        recovery: RecoveryLog,
        item: Outgoing,
        outcome: PushOutcome,
        seqs: Mapping[str, int],
    ) -> PushOutcome | ImrouteError:
        """`_queue`, its error being this message's alone."""
        try:
            return await self._queue(recovery, item.message, outcome, item.expires_ms, seqs)
        except ImrouteError as exc:
            return exc

    async def _lookup(self, uids: Sequence[str]) -> dict[str, list[Route]]:
        tracer = traced(self._tracer)
        if tracer is None:
            return await self._registry.lookup(uids)
        attributes = {"imroute.recipients": len(uids)}
        with leaf_span(tracer, "routes.lookup", attributes=attributes) as span:
            routes = await self._registry.lookup(uids)
            span.set_attribute("imroute.routes", sum(len(r) for r in routes.values()))
            return routes

    def _dropped(self, dropped: int) -> None:
        if dropped:
            self.inbox_dropped += dropped
            log.info("inbox full: dropped the %d oldest entries (IMROUTE_INBOX_MAX)", dropped)

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
        routes = await self._lookup(uids)
        if not routes:
            return None
        again = await self._delivery.deliver(message, list(routes), routes, expires_ms, seqs)
        return list(again.delivered)

    async def aclose(self) -> None:
        """Stop the background retries (what they carry stays in the inboxes)."""
        for task in list(self._retrying):
            task.cancel()
        await asyncio.gather(*self._retrying, return_exceptions=True)


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
