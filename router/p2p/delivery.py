"""P2P delivery against the live fleet: plan each message's recipients by gateway, call
the gateways, merge their answers, and forget the routes a gateway disowned.

One message (`deliver`) makes one call per gateway; many (`deliver_many`, the batch
endpoint's path) make one delivery per message and gateway, all of a gateway's sent
together (`deliver_each`: in as few calls as the client stack makes of them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext

from router.fleet.cache import CachedFleet
from router.gateway_rpc.base import GatewayClient, deliver_each
from router.p2p.plan import (
    EXPIRED_ERROR,
    DeliveryPlan,
    GatewayOutcome,
    Outgoing,
    PushOutcome,
    Target,
    gateway_outcome,
    merge,
    plan_p2p,
)
from router.routes.base import RouteRegistry
from shared.batches import to_batch
from shared.clock import Clock
from shared.errors import GatewayUnavailable, RegistryUnavailable
from shared.ids import new_id
from shared.models import Message, Route
from shared.positions import counter_of, epoch_of
from shared.proto import gateway_pb2
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

__all__ = ["CLOCK_MARGIN_MS", "STALE_RECHECK_S", "Delivery", "deliver_expiry_ms"]

log = logging.getLogger(__name__)

# A route of an unknown gateway makes the push re-read the fleet if the cached copy is
# older than this.
STALE_RECHECK_S = 0.25
# Every P2P batch expires by the end of its call (`deliver_expiry_ms`), this much early:
# the gateways' clocks may be a little ahead of ours (NTP keeps them far closer).
CLOCK_MARGIN_MS = 250

Routes = Mapping[str, Sequence[Route]]


class Delivery:
    """Delivers P2P messages to the live gateways holding their recipients' routes."""

    def __init__(
        self,
        registry: RouteRegistry,
        fleet: CachedFleet,
        clients: GatewayClient,
        timeout_s: float,
        clock: Clock,
        tracer: Tracer | None = None,
    ) -> None:
        self._registry = registry
        self._fleet = fleet
        self._clients = clients
        self._timeout = timeout_s
        self._clock = clock
        self._tracer = tracer  # a span per gateway call (shared.tracing), when on

    async def deliver(
        self,
        message: Message,
        uids: Sequence[str],
        routes: Routes,
        expires_ms: int,
        seqs: Mapping[str, int],
    ) -> PushOutcome:
        """One message to the connections `routes` name, one call per gateway."""
        live = await self._live()
        plan = plan_p2p(uids, routes, live)
        if (plan.stale or plan.unknown) and self._fleet.age() > STALE_RECHECK_S:
            self._fleet.invalidate()  # as in `_plans`
            plan = plan_p2p(uids, routes, await self._live())
        targets = list(plan.targets.values())
        if len(targets) == 1:  # the usual P2P push: no gather, no task
            outcomes = [await self._call(message, targets[0], expires_ms, seqs)]
        else:
            outcomes = await asyncio.gather(
                *(self._call(message, t, expires_ms, seqs) for t in targets)
            )
        merged = merge(uids, plan, outcomes)
        await self._settle(merged.errors, merged.gone)
        return merged

    async def deliver_many(
        self, items: Sequence[Outgoing], routes: Routes, seqs: Sequence[Mapping[str, int]]
    ) -> list[PushOutcome]:
        """Each message to its recipients' connections: a batch per message and gateway,
        each gateway's batches sent together (in message order)."""
        plans = await self._plans([item.uids for item in items], routes)
        lanes: dict[tuple[str, str], list[tuple[int, Target]]] = {}
        for i, plan in enumerate(plans):
            for t in plan.targets.values():
                lanes.setdefault((t.gateway_id, t.address), []).append((i, t))
        got: list[list[GatewayOutcome]] = [[] for _ in items]

        async def lane(gateway_id: str, address: str, entries: list[tuple[int, Target]]) -> None:
            batches = [
                self._batch(items[i].message, t, items[i].expires_ms, seqs[i]) for i, t in entries
            ]
            with self._span(gateway_id, batches) as span:
                replies = await deliver_each(
                    self._clients, gateway_id, address, batches, self._timeout
                )
                outcomes = [
                    _failed(t, r) if isinstance(r, GatewayUnavailable) else _outcome(t, r)
                    for (_, t), r in zip(entries, replies, strict=True)
                ]
                if span is not None:
                    _annotate(span, outcomes)
            for (i, _), outcome in zip(entries, outcomes, strict=True):
                got[i].append(outcome)

        await asyncio.gather(*(lane(g, a, e) for (g, a), e in lanes.items()))
        merged = [merge(it.uids, p, o) for it, p, o in zip(items, plans, got, strict=True)]
        await self._settle(
            [e for m in merged for e in m.errors], [r for m in merged for r in m.gone]
        )
        return merged

    async def _plans(
        self, uid_lists: Sequence[Sequence[str]], routes: Routes
    ) -> list[DeliveryPlan]:
        live = await self._live()
        plans = [plan_p2p(uids, routes, live) for uids in uid_lists]
        if any(p.stale or p.unknown for p in plans) and self._fleet.age() > STALE_RECHECK_S:
            # The cache may predate a gateway that just started: ask Redis once more (but
            # not on every push while a dead gateway's routes are still expiring).
            self._fleet.invalidate()
            live = await self._live()
            plans = [plan_p2p(uids, routes, live) for uids in uid_lists]
        return plans

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

    def _batch(
        self, message: Message, target: Target, expires_ms: int, seqs: Mapping[str, int]
    ) -> gateway_pb2.Batch:
        batch = to_batch(message, target.uids, new_id())
        batch.expires_ms = deliver_expiry_ms(expires_ms, self._clock.now_ms(), self._timeout)
        if seqs:
            # The wire carries each recipient's counter and its log's epoch apart.
            mine = [seqs[uid] for uid in target.uids]
            batch.seqs.extend([counter_of(seq) for seq in mine])
            batch.epochs.extend([epoch_of(seq) for seq in mine])
        return batch

    async def _call(
        self, message: Message, target: Target, expires_ms: int, seqs: Mapping[str, int]
    ) -> GatewayOutcome:
        batch = self._batch(message, target, expires_ms, seqs)
        if traced(self._tracer) is None:
            return await self._send(target, batch)
        with self._span(target.gateway_id, [batch]) as span:
            outcome = await self._send(target, batch)
            if span is not None:
                _annotate(span, [outcome])
            return outcome

    async def _send(self, target: Target, batch: gateway_pb2.Batch) -> GatewayOutcome:
        try:
            reply = await self._clients.deliver(
                target.gateway_id, target.address, batch, self._timeout
            )
        except GatewayUnavailable as exc:
            return _failed(target, exc)
        return _outcome(target, reply)

    def _span(
        self, gateway_id: str, batches: Sequence[gateway_pb2.Batch]
    ) -> AbstractContextManager[Span | None]:
        """The gateway call's span (None: tracing off); its batches name it as their
        parent, so the gateway's spans join each push's trace."""
        tracer = traced(self._tracer)
        if tracer is None:
            return nullcontext()
        return _call_span(tracer, gateway_id, batches)

    async def _forget(self, routes: Sequence[Route]) -> None:
        """Delete routes their own gateway disowned; the push has its answer, so only log."""
        if not routes:
            return
        try:
            await self._registry.remove(routes)
        except RegistryUnavailable as exc:
            log.warning("could not remove %d stale routes: %s", len(routes), exc)


def _failed(target: Target, exc: GatewayUnavailable) -> GatewayOutcome:
    # Logged where it happened: by the call listeners (per RPC), the coalescer (queued
    # too long) or the circuit (when it opened).
    log.debug(
        "deliver to %s failed: %s",
        target.gateway_id,
        exc.reason,
        extra={"gateway_id": target.gateway_id},
    )
    suspect = exc.code == "UNAVAILABLE"
    return GatewayOutcome(target.gateway_id, error=exc.reason, suspect=suspect)


def _outcome(target: Target, reply: gateway_pb2.DeliverReply) -> GatewayOutcome:
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
    # each costs CPU on every traced push (docs/benchmarks.md, "Tracing").
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
