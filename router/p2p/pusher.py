"""The P2P path against the live fleet: log each message into its recipients' logs and
inboxes (where it stays until a device acks it), look their routes up, plan each
message's recipients by gateway, call the gateways, merge their answers, forget the
routes a gateway disowned, and retry in the background the recipients whose gateway
failed.

One API for any number of messages (`P2PPusher.push`); a single push is a batch of one:
one log-and-inbox write for all the stored messages, one look-up for all their
recipients, one delivery per message and gateway, each gateway's sent together (in as
few calls as the client stack makes of them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from router.fleet.cache import CachedFleet
from router.gateway_rpc.base import EachGatewayClient
from router.p2p.plan import (
    EXPIRED_ERROR,
    GatewayOutcome,
    Outgoing,
    PushOutcome,
    Target,
    gateway_outcome,
    merge,
    plan_p2p,
    unrouted,
)
from router.recovery.base import RecoveryLog
from router.routes.base import RouteRegistry
from shared.backoff import jittered
from shared.batches import to_batch
from shared.clock import Clock, SystemClock
from shared.errors import GatewayUnavailable, ImrouteError, RegistryUnavailable
from shared.ids import new_id
from shared.models import Message, Route
from shared.positions import counter_of, epoch_of
from shared.proto import gateway_pb2
from shared.tasks import Background
from shared.throttled import ThrottledLine
from shared.tracing import (
    AttributeValue,
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    leaf_span,
    traced,
    traceparent,
)

__all__ = ["CLOCK_MARGIN_MS", "STALE_RECHECK_S", "P2PPusher", "deliver_expiry_ms"]

log = logging.getLogger(__name__)

# When a push that failed for a connected recipient is tried again (seconds after the
# previous try): past a circuit breaker's cool-off (IMROUTE_CIRCUIT_COOL_OFF_S, 10 s).
# Each wait between half of it and all of it (`shared.backoff.jittered`): 23 to 46 s in all.
RETRY_AFTER_S = (1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 8.0, 8.0, 16.0)
MAX_RETRYING = 10_000  # pushes being retried at once; beyond, the inbox alone keeps them
NOT_RETRIED_LOG_EVERY_S = 10.0
# A route of an unknown gateway makes the push re-read the fleet if the cached copy is
# older than this.
STALE_RECHECK_S = 0.25
# Every P2P batch expires by the end of its call (`deliver_expiry_ms`), this much early:
# the gateways' clocks may be a little ahead of ours (NTP keeps them far closer).
CLOCK_MARGIN_MS = 250

Routes = Mapping[str, Sequence[Route]]
Seqs = Mapping[str, int]  # each recipient's position in its log (stored messages)
_NO_SEQS: Seqs = {}  # not stored: no positions (shared, never written)


class P2PPusher:
    """Pushes messages, each to a list of users, wherever they are connected."""

    def __init__(
        self,
        registry: RouteRegistry,
        fleet: CachedFleet,
        clients: EachGatewayClient,
        deliver_timeout_s: float,
        recovery: RecoveryLog | None = None,
        clock: Clock | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        """`tracer`: tracing on (shared.tracing), each look-up and gateway call a span."""
        self._registry = registry
        self._fleet = fleet
        # The stack every P2P call goes through (each gateway's batches delivered
        # together, each on its own), its method looked up once.
        self._deliver_each = clients.deliver_each
        self._timeout = deliver_timeout_s
        self._recovery = recovery
        self._clock = clock or SystemClock()
        self._tracer = tracer
        self.inbox_dropped = 0  # entries the inbox bound (IMROUTE_INBOX_MAX) pushed out
        # Queued for a user whose gateway failed: the user may well be connected (a
        # gateway back from a restart while its circuit is still open), and the inbox is
        # read only when a connection starts. So the push is tried again, in the background.
        self._retrying = Background("retrying a queued push", log)
        # Each background retry's recipients it has not reached yet, under the id of that
        # list (held here, so no other list can take its id meanwhile).
        self._left: dict[int, list[str]] = {}
        self.retried = 0  # recipients a later try reached
        # Recipients of failed pushes not retried: MAX_RETRYING were being retried already.
        self.not_retried = ThrottledLine(
            log,
            "%(n)d recipient(s) of failed P2P pushes not retried in the background: "
            "%(retrying)d pushes are being retried already; their inboxes keep the pushes "
            "for their next connection",
            every_s=NOT_RETRIED_LOG_EVERY_S,
            now=self._clock.monotonic,
        )
        # Recipients the background retries gave up on (their gateways kept failing past
        # RETRY_AFTER_S, or the service stopped): their inboxes keep the pushes.
        self.given_up = ThrottledLine(
            log,
            "%(n)d recipient(s) of failed P2P pushes no longer retried in the background "
            "(%(why)s); the pushes wait in their inboxes: a connected client gets them "
            "with its next push or on its next connect (%(total)d in all)",
            now=self._clock.monotonic,
        )
        # The steps after a push's answer that Redis did not take (each push's, in an
        # outage): one line per 10 s with the count, naming the last.
        self.after_answer_failed = ThrottledLine(
            log,
            "%(n)d step(s) after pushes' answers failed in Redis; the last: %(what)s (%(exc)s)",
            now=self._clock.monotonic,
        )
        # Told of the recipients a background retry reached (their push's receipt).
        self.on_retried: Callable[[str, Sequence[str]], Awaitable[None]] | None = None

    async def push(self, items: Sequence[Outgoing]) -> list[PushOutcome | ImrouteError]:
        """Deliver each message to its uids' live connections. A stored one (the default,
        with a recovery log) is logged first, so a resuming client can get it again, and
        queued in the inbox of each recipient it reached no connection of. Each message's
        outcome, or the error that failed it alone; an error that fails them all (the
        log's, or the look-up's when nothing was logged) is raised. A logged message
        whose routes or gateways could not be read is failed and queued (`unrouted`)."""
        if len(items) != 1:
            return await self._push_many(items)
        # A batch of one (POST /v1/push, the hottest path): no positions, lists and loops
        # over a batch (they cost it 10 % of its CPU in this process, bench.p2p_inprocess).
        item = items[0]
        stored = item.store and self._recovery is not None
        wanted = [(item.message, item.uids, item.expires_ms)] if stored else []
        routes, logged = await self._log_and_look_up(item.uids, wanted)
        seqs = logged[0] if stored else _NO_SEQS
        if isinstance(routes, ImrouteError):  # logged and queued, its routes unread
            outcome = unrouted(item.uids, routes)
        else:
            try:
                [outcome] = await self._deliver(items, routes, [seqs])
            except ImrouteError as exc:  # the fleet unread: before any gateway was called
                if not stored:
                    raise
                outcome = unrouted(item.uids, exc)
        if not stored:
            return [outcome]
        outcome.positions = seqs
        if outcome.offline or outcome.failed:
            return [await self._queued(item, outcome, seqs)]
        return [outcome]

    async def _push_many(self, items: Sequence[Outgoing]) -> list[PushOutcome | ImrouteError]:
        uids = list(dict.fromkeys(u for item in items for u in item.uids))
        seqs: list[Seqs] = [_NO_SEQS] * len(items)
        stored = [i for i, item in enumerate(items) if item.store] if self._recovery else []
        wanted = [(items[i].message, items[i].uids, items[i].expires_ms) for i in stored]
        routes, logged = await self._log_and_look_up(uids, wanted)
        for i, seq in zip(stored, logged, strict=True):
            seqs[i] = seq
        outcomes: list[PushOutcome | ImrouteError]
        delivered: list[PushOutcome] = []
        if not isinstance(routes, ImrouteError):
            try:
                delivered = await self._deliver(items, routes, seqs)
            except ImrouteError as exc:  # the fleet unread: before any gateway was called
                if not stored:
                    raise
                routes = exc
        if isinstance(routes, ImrouteError):
            # The stored messages wait in their inboxes; the others were not sent at all.
            delivered = [unrouted(item.uids, routes) for item in items]
            outcomes = [routes] * len(items)
            for i in stored:
                outcomes[i] = delivered[i]
        else:
            outcomes = list(delivered)
        for i in stored:
            delivered[i].positions = seqs[i]
        missed = [i for i in stored if delivered[i].offline or delivered[i].failed]
        if missed:
            queued = await asyncio.gather(
                *(self._queued(items[i], delivered[i], seqs[i]) for i in missed)
            )
            for i, outcome in zip(missed, queued, strict=True):
                outcomes[i] = outcome
        return outcomes

    async def _log_and_look_up(
        self, uids: Sequence[str], wanted: Sequence[tuple[Message, Sequence[str], int]]
    ) -> tuple[dict[str, list[Route]] | ImrouteError, list[Seqs]]:
        """Look `uids`' routes up, and log each `wanted` message (message, uids,
        expires_ms) into its uids' logs and inboxes, at once: the routes, and each
        message's positions by uid. A look-up that failed while the messages were logged
        (a Cluster node of routes down, the logs' up) is its error in the routes' place:
        the messages wait in the inboxes, and only their delivery now failed. Raised:
        the log's error, or the look-up's where nothing is logged."""
        recovery = self._recovery
        if recovery is None or not wanted:
            return await self._lookup(uids), []
        # Logged before any gateway can write it: a replay never misses a live push.
        # Both at once, with no task: the store sends the append now (on the
        # auto-pipeline; else a task of its own), the look-up joins its round trip.
        appending = recovery.append_queued_many(wanted)
        routes: dict[str, list[Route]] | ImrouteError
        try:
            routes = await self._lookup(uids)
        except ImrouteError as exc:
            routes = exc  # the append's outcome decides: awaited below
        except BaseException:
            # As gather would: the append goes on; its outcome is not ours to wait for.
            asyncio.ensure_future(appending).add_done_callback(_consume)
            raise
        seqs: list[Seqs] = []
        dropped = 0
        for (_, mine, _), (logged, over) in zip(wanted, await appending, strict=True):
            seqs.append(dict(zip(mine, logged, strict=True)))
            dropped += over
        self._dropped(dropped)
        return routes, seqs

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

    # ------------------------------------------------------------------ delivery

    async def _deliver(
        self, items: Sequence[Outgoing], routes: Routes, seqs: Sequence[Seqs]
    ) -> list[PushOutcome]:
        """Each message to the connections `routes` name: a batch per message and
        gateway, each gateway's batches sent together (in message order)."""
        live = await self._live()
        plans = [plan_p2p(item.uids, routes, live) for item in items]
        if any(p.stale or p.unknown for p in plans) and self._fleet.age() > STALE_RECHECK_S:
            # The cache may predate a gateway that just started: ask Redis once more (but
            # not on every push while a dead gateway's routes are still expiring).
            self._fleet.invalidate()
            live = await self._live()
            plans = [plan_p2p(item.uids, routes, live) for item in items]
        if len(plans) == 1 and len(plans[0].targets) == 1:
            # The usual P2P push, one message to one gateway: no lanes to sort it into
            # (7% of its CPU in the router, by the profile).
            plan = plans[0]
            [t] = plan.targets.values()
            outcomes = await self._call((t.gateway_id, t.address), [(0, t)], items, seqs)
            only = merge(items[0].uids, plan, outcomes)
            if only.errors or only.gone:
                await self._settle(only.errors, only.gone)
            return [only]
        # Per gateway (id, address): each message's target there.
        lanes: dict[tuple[str, str], list[tuple[int, Target]]] = {}
        for i, plan in enumerate(plans):
            for t in plan.targets.values():
                entries = lanes.get((t.gateway_id, t.address))
                if entries is None:
                    lanes[t.gateway_id, t.address] = [(i, t)]
                else:
                    entries.append((i, t))
        answers = await asyncio.gather(
            *(self._call(lane, entries, items, seqs) for lane, entries in lanes.items())
        )
        # Each message's answers in the order its gateways were called.
        got: list[list[GatewayOutcome]] = [[] for _ in items]
        for entries, outcomes in zip(lanes.values(), answers, strict=True):
            for (i, _), outcome in zip(entries, outcomes, strict=True):
                got[i].append(outcome)
        merged = [merge(it.uids, p, o) for it, p, o in zip(items, plans, got, strict=True)]
        await self._settle(
            [e for m in merged for e in m.errors], [r for m in merged for r in m.gone]
        )
        return merged

    async def _call(
        self,
        lane: tuple[str, str],
        entries: Sequence[tuple[int, Target]],
        items: Sequence[Outgoing],
        seqs: Sequence[Seqs],
    ) -> list[GatewayOutcome]:
        """One gateway's batches (one per message), sent together; each one's outcome."""
        gateway_id, address = lane
        batches = [self._batch(items[i], t, seqs[i]) for i, t in entries]
        tracer = traced(self._tracer)
        if tracer is None:
            replies = await self._deliver_each(gateway_id, address, batches, self._timeout)
            return [_outcome(t, r) for (_, t), r in zip(entries, replies, strict=True)]
        # The call's span: its batches name it as their parent, so the gateway's spans
        # join each push's trace.
        with _call_span(tracer, gateway_id, batches) as span:
            replies = await self._deliver_each(gateway_id, address, batches, self._timeout)
            outcomes = [_outcome(t, r) for (_, t), r in zip(entries, replies, strict=True)]
            _annotate(span, outcomes)
            return outcomes

    async def _settle(self, errors: Sequence[GatewayOutcome], gone: Sequence[Route]) -> None:
        """After the calls: a fresh look at the fleet if a gateway may have died, and the
        disowned routes deleted."""
        if any(e.suspect for e in errors) and self._fleet.age() > STALE_RECHECK_S:
            # A failing gateway may have died since the fleet was cached: read it again,
            # but not on every push while a sick gateway keeps failing.
            self._fleet.invalidate()
        # Routes of gateways missing from the fleet are skipped, not deleted: they expire
        # by their own deadline, and a gateway that merely missed a heartbeat keeps them.
        await self._forget(gone)

    async def _live(self) -> dict[str, str]:
        return {g.gateway_id: g.grpc_address for g in await self._fleet.live()}

    def _batch(self, item: Outgoing, target: Target, seqs: Seqs) -> gateway_pb2.Batch:
        batch = to_batch(item.message, target.uids, new_id())
        batch.expires_ms = deliver_expiry_ms(item.expires_ms, self._clock.now_ms(), self._timeout)
        if seqs:
            # The wire carries each recipient's counter and its log's epoch apart.
            mine = [seqs[uid] for uid in target.uids]
            batch.seqs.extend([counter_of(seq) for seq in mine])
            batch.epochs.extend([epoch_of(seq) for seq in mine])
        return batch

    async def _forget(self, routes: Sequence[Route]) -> None:
        """Delete routes their own gateway disowned; the push has its answer, so only log."""
        if not routes:
            return
        try:
            await self._registry.remove(routes)
        except RegistryUnavailable as exc:
            what = f"removing {len(routes)} stale route(s) their gateways disowned"
            self.after_answer_failed.note(what=what, exc=exc)

    # ------------------------------------------------------------------ the inbox

    async def _queued(self, item: Outgoing, outcome: PushOutcome, seqs: Seqs) -> PushOutcome:
        """For whoever it reached no connection of (it waits in their inbox): look once
        more, for a client that connected (and read its inbox, maybe before the message
        was in it) while this push was on its way; retry the failed in the background."""
        waiting = [*outcome.offline, *outcome.failed]
        # Only the offline: a failed gateway would fail again, and cost another timeout.
        late: set[str] = set()
        if outcome.offline:
            offline = dataclasses.replace(item, uids=outcome.offline)
            try:
                reached = await self._redeliver(offline, seqs)
            except ImrouteError as exc:
                # The push is in their inboxes and went to whoever was online: its
                # answer stands (only the race this look-up covers is not covered).
                what = "a queued push's second look-up (its answer stands)"
                self.after_answer_failed.note(what=what, exc=exc)
                reached = None
            late = set(reached or ())
        if outcome.failed and len(self._retrying) < MAX_RETRYING:
            failed = dataclasses.replace(item, uids=list(outcome.failed))
            left = list(outcome.failed)
            self._left[id(left)] = left  # counted at the stop even if it never starts
            self._retrying.spawn(self._retry(failed, dict(seqs), left))
        elif outcome.failed:
            self.not_retried.note(len(outcome.failed), retrying=MAX_RETRYING)
        if not late:
            return dataclasses.replace(outcome, queued=waiting)
        return dataclasses.replace(
            outcome,
            delivered=[*outcome.delivered, *(u for u in waiting if u in late)],
            offline=[u for u in outcome.offline if u not in late],
            failed=[u for u in outcome.failed if u not in late],
            queued=[u for u in waiting if u not in late],
        )

    async def _retry(self, item: Outgoing, seqs: Seqs, left: list[str]) -> None:
        """Deliver a queued push to failed recipients again, until it reaches them (and
        leaves their inbox), it expires, or RETRY_AFTER_S runs out. A recipient that
        reconnects meanwhile gets it from the inbox; its gateway then writes it once.
        Those it gives up on (the tries ran out, or the service stopped) are counted and
        said: a client connected all along gets the push only with its next one, or on
        its next connect."""
        try:
            waited = await self._retries(item, seqs, left)
        except Exception:
            del self._left[id(left)]
            self.given_up.note(len(left), why="the retry failed unexpectedly: logged")
            raise
        del self._left[id(left)]
        if waited is not None and left:
            self.given_up.note(len(left), why=f"their gateways failed for {waited:.0f} s")

    async def _retries(self, item: Outgoing, seqs: Seqs, left: list[str]) -> float | None:
        """The tries of `_retry`; `left` is kept to those not reached yet. The seconds
        they took when they ran out; None when none is left to try (reached, offline
        now, or past the push's ttl_s)."""
        message, expires_ms = item.message, item.expires_ms
        # Its age from the loop's clock (no wall clock here): never delivered past ttl_s.
        waited = 0.0
        for ceiling in RETRY_AFTER_S:
            # Jittered: the pushes that failed together (a gateway, or Redis, out for a
            # while) do not all come back in the same instant.
            delay = jittered(ceiling)
            await asyncio.sleep(delay)
            waited += delay
            if not left or (expires_ms and message.ts_ms + waited * 1000 > expires_ms):
                return None
            try:
                reached = await self._redeliver(dataclasses.replace(item, uids=list(left)), seqs)
            except ImrouteError as exc:
                log.debug("retrying a queued push failed: %s", exc)
                continue
            if reached is None:
                return None  # offline now: the inbox has it for their next connection
            self.retried += len(reached)
            if reached and self.on_retried is not None:
                try:
                    await self.on_retried(message.push_id, reached)
                except ImrouteError as exc:
                    what = "recording a retried push's deliveries in its receipt"
                    self.after_answer_failed.note(what=what, exc=exc)
            done = set(reached)
            left[:] = [u for u in left if u not in done]
        return waited

    async def _redeliver(self, item: Outgoing, seqs: Seqs) -> list[str] | None:
        """Deliver a queued push again to those of its uids with a live route now (it
        stays in their inboxes until a device acks it). None: none has a route."""
        routes = await self._lookup(item.uids)
        if not routes:
            return None
        [again] = await self._deliver(
            [dataclasses.replace(item, uids=list(routes))], routes, [seqs]
        )
        return list(again.delivered)

    async def aclose(self) -> None:
        """Stop the background retries (what they carry stays in the inboxes)."""
        await self._retrying.cancel()
        if left := sum(len(uids) for uids in self._left.values()):
            self.given_up.note(left, why="the push service stopped")
        self._left.clear()


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _outcome(
    target: Target, reply: gateway_pb2.DeliverReply | GatewayUnavailable
) -> GatewayOutcome:
    if isinstance(reply, GatewayUnavailable):
        # Logged where it happened: by the resilient client (per call), the coalescer
        # (queued too long) or the circuit (when it opened).
        log.debug(
            "deliver to %s failed: %s",
            target.gateway_id,
            reply.reason,
            extra={"gateway_id": target.gateway_id},
        )
        suspect = reply.code == "UNAVAILABLE"
        return GatewayOutcome(target.gateway_id, error=reply.reason, suspect=suspect)
    if reply.duplicate and not reply.delivered and not reply.missing and not reply.expired:
        # Rare enough to log (`gateway_outcome` says why it counts as delivered).
        log.warning(
            "deliver to %s: a retried batch's first answer is gone; reporting its "
            "%d recipients delivered",
            target.gateway_id,
            len(target.uids),
            extra={"gateway_id": target.gateway_id},
        )
    return gateway_outcome(target, reply)


@contextmanager
def _call_span(
    tracer: Tracer, gateway_id: str, batches: Sequence[gateway_pb2.Batch]
) -> Iterator[Span]:
    # Few attributes, and not made the current span (nothing under it in this process):
    # each costs CPU on every traced push (docs/benchmarks/index.md, "Tracing").
    attributes: dict[str, AttributeValue] = {"imroute.gateway_id": gateway_id}
    if len(batches) > 1:
        attributes["imroute.batches"] = len(batches)
    with leaf_span(tracer, "gateway.call", SpanKind.CLIENT, attributes) as span:
        parent = traceparent(span)
        for batch in batches:
            batch.traceparent = parent
        yield span


def _annotate(span: Span, outcomes: Sequence[GatewayOutcome]) -> None:
    """What a gateway call's batches came to, on its span."""
    errors = [o.error for o in outcomes if o.error and o.error != EXPIRED_ERROR]
    attributes: dict[str, AttributeValue] = {
        "imroute.delivered": sum(len(o.delivered) for o in outcomes),
        "imroute.missing": sum(len(o.missing) for o in outcomes),
    }
    expired = sum(o.error == EXPIRED_ERROR for o in outcomes)
    if expired:
        attributes["imroute.expired"] = expired
    span.set_attributes(attributes)
    if errors:
        span.set_status(Status(StatusCode.ERROR, errors[0]))


def deliver_expiry_ms(expires_ms: int, now_ms: int, timeout_s: float) -> int:
    """When the gateway must stop writing a P2P batch sent now: at its ttl_s (`expires_ms`,
    0 for none) or at the call's deadline, whichever comes first. Past the deadline the
    caller has been told `failed`; a gateway that writes it later would make that a lie."""
    margin = min(CLOCK_MARGIN_MS, int(timeout_s * 250))  # a quarter of short timeouts
    deadline = now_ms + int(timeout_s * 1000) - margin
    return min(expires_ms, deadline) if expires_ms else deadline
