"""P2P pushes: one message to 1-1000 users, delivered over gRPC wherever they are
connected; its receipt recorded; with `wait_ack_ms`, the acks waited for."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from push_service.content import new_message
from push_service.idempotency.http import id_seed
from push_service.schemas import PushIn
from router.p2p.plan import Outgoing, PushOutcome
from router.p2p.pusher import P2PPusher
from router.receipts.base import NewReceipt, ReceiptLimits, ReceiptLog, ReceiptReads
from router.receipts.record import message_meta, p2p_receipt, split_acked
from router.receipts.wait import wait_acks
from shared.clock import Clock
from shared.errors import ImrouteError, InvalidInput
from shared.logs import bind, unbind
from shared.models import Message
from shared.tracing import AttributeValue, Span, current_span

__all__ = ["Pushed", "Pushes", "Receipts"]

log = logging.getLogger(__name__)


@dataclass(slots=True)  # not frozen: one per message; frozen costs 5x to build
class Pushed:
    """A P2P push's message (its ids) and what became of each recipient."""

    message: Message
    outcome: PushOutcome
    # With wait_ack_ms: the recipients a device acked, and the rest.
    acked: list[str] | None = None
    unacked: list[str] | None = None


@dataclass(slots=True)
class Receipts:
    """The receipt store's two sides as the P2P path uses them, and its bounds."""

    log: ReceiptLog
    reads: ReceiptReads
    limits: ReceiptLimits
    preview: bool = True  # IMROUTE_WEBHOOK_PREVIEW
    # IMROUTE_WEBHOOK_UNACKED_S in ms, when webhooks are on (0: no message.unacked)
    unacked_ms: int = 0
    failed: int = 0

    def due_ms(self, now_ms: int, store: bool) -> int:
        """When a push's message.unacked is due (0: none; only stored messages)."""
        return (
            now_ms + self.unacked_ms if self.unacked_ms and store else 0
        )  # receipts that could not be written (the push itself went out)


class Pushes:
    """Builds the message once (content encoded at the edge) and pushes it P2P."""

    def __init__(
        self,
        pusher: P2PPusher,
        clock: Clock,
        receipts: Receipts | None = None,
        traced: bool = False,
    ) -> None:
        """`traced`: tracing is on; the push's ids and outcome go on its request's span."""
        self._traced = traced
        self._pusher = pusher
        self._clock = clock
        self._receipts = receipts
        # For the dashboard (router.stats): pushes by endpoint, recipients left queued.
        self.pushed = 0  # POST /v1/push
        self.batched = 0  # messages of POST /v1/push/batch
        self.queued = 0

    def check(self, body: PushIn) -> None:
        """What the push cannot have, before anything is sent (InvalidInput: 422)."""
        if body.wait_ack_ms is None:
            return
        r = self._receipts
        if r is None:
            raise InvalidInput("wait_ack_ms", "receipts are off (IMROUTE_RECEIPTS_TTL_S=0)")
        if len(body.to) > r.limits.max_recipients:
            raise InvalidInput(
                "wait_ack_ms",
                f"at most {r.limits.max_recipients} recipients "
                "(IMROUTE_RECEIPTS_MAX_RECIPIENTS) keep per-recipient states",
            )

    async def push_many(self, bodies: Sequence[PushIn]) -> list[Pushed | ImrouteError]:
        """`push` for each body at once (`P2PPusher.push_many`), their receipts recorded
        in one write; each one's answer, or the error that failed it. It waits for no
        acks: a body with `wait_ack_ms` fails alone (422)."""
        answers: list[Pushed | ImrouteError | None] = [None] * len(bodies)
        items: list[Outgoing] = []
        where: list[int] = []
        now = self._clock.now_ms()
        for i, body in enumerate(bodies):
            try:
                if body.wait_ack_ms is not None:
                    raise InvalidInput("wait_ack_ms", "not in a batch: use POST /v1/push")
                message = new_message(body, now, id_seed(), i)
            except ImrouteError as exc:
                answers[i] = exc
                continue
            expires_ms = message.ts_ms + body.ttl_s * 1000 if body.ttl_s else 0
            items.append(Outgoing(message, body.to, expires_ms, body.store))
            where.append(i)
        self.batched += len(items)
        if self._traced:
            current_span().set_attributes({"imroute.mode": "p2p", "imroute.messages": len(items)})
        try:
            outcomes = await self._pusher.push_many(items) if items else []
        except ImrouteError as exc:
            outcomes = [exc] * len(items)
        r = self._receipts
        receipts: list[tuple[NewReceipt, bool, int]] = []
        for i, item, outcome in zip(where, items, outcomes, strict=True):
            answers[i] = (
                outcome if isinstance(outcome, ImrouteError) else Pushed(item.message, outcome)
            )
            if not isinstance(outcome, ImrouteError):
                self.queued += len(outcome.queued)
                if r is not None:
                    receipts.append(self._receipt(r, item, outcome))
        if r is not None and receipts:
            try:
                await r.log.record_many(receipts)
            except ImrouteError as exc:
                r.failed += len(receipts)
                log.warning("could not record the receipts of %d pushes: %s", len(receipts), exc)
        return [a for a in answers if a is not None]

    def _receipt(
        self, r: Receipts, item: Outgoing, outcome: PushOutcome
    ) -> tuple[NewReceipt, bool, int]:
        """The push's receipt, whether it lists its recipients, when its message.unacked
        is due (0: none)."""
        listable = len(item.uids) <= r.limits.max_recipients
        meta = message_meta(item.message, r.preview)
        now_ms = self._clock.now_ms()
        ttl_passed = bool(item.expires_ms) and now_ms >= item.expires_ms
        receipt = p2p_receipt(item.message, item.uids, outcome, meta, item.store, ttl_passed)
        return receipt, listable, r.due_ms(now_ms, item.store)

    async def push(self, body: PushIn) -> Pushed:
        """Deliver now to every recipient's live connections; queue the rest (stored)."""
        self.check(body)
        message = new_message(body, self._clock.now_ms(), id_seed())
        # Every line logged while it is pushed (its retries included) names it.
        bound = bind(push_id=message.push_id, msg_id=message.msg_id)
        try:
            span = current_span() if self._traced else None
            if span is None or not span.is_recording():  # off, or this push not sampled
                return await self._push(body, message)
            span.set_attributes(_span_ids(message, len(body.to)))
            pushed = await self._push(body, message)
            _annotate(span, pushed)
            return pushed
        finally:
            unbind(bound)

    async def _push(self, body: PushIn, message: Message) -> Pushed:
        expires_ms = message.ts_ms + body.ttl_s * 1000 if body.ttl_s else 0
        outcome = await self._pusher.push(message, body.to, expires_ms, store=body.store)
        self.pushed += 1
        self.queued += len(outcome.queued)
        r = self._receipts
        if r is None:
            return Pushed(message, outcome)
        receipt, listable, due = self._receipt(
            r, Outgoing(message, body.to, expires_ms, body.store), outcome
        )
        try:
            await r.log.record(receipt, listable, due)
        except ImrouteError as exc:
            # The push went out; only its receipt is missing (GET answers 404 for it).
            r.failed += 1
            log.warning("could not record the receipt of push %s: %s", message.push_id, exc)
            if body.wait_ack_ms is None:
                return Pushed(message, outcome)
        if body.wait_ack_ms is None:
            return Pushed(message, outcome)
        online = [*outcome.delivered, *outcome.failed]
        try:
            states = await wait_acks(
                r.reads, message.push_id, online, body.to, body.wait_ack_ms / 1000, self._clock
            )
        except ImrouteError as exc:
            log.warning("could not read the acks of push %s: %s", message.push_id, exc)
            states = {}
        acked, unacked = split_acked(body.to, states)
        return Pushed(message, outcome, acked, unacked)


def _span_ids(message: Message, recipients: int) -> dict[str, AttributeValue]:
    return {
        "imroute.push_id": message.push_id,
        "imroute.msg_id": message.msg_id,
        "imroute.recipients": recipients,
    }


def _annotate(span: Span, pushed: Pushed) -> None:
    """A push's outcome on its span: counts (never uids); acks waited for, an event."""
    o = pushed.outcome
    counts = {
        "delivered": o.delivered,
        "offline": o.offline,
        "failed": o.failed,
        "queued": o.queued,
    }
    # Only what is not zero: every attribute costs CPU on every traced push.
    span.set_attributes({f"imroute.{k}": len(v) for k, v in counts.items() if v})
    if pushed.acked is not None:
        span.add_event(
            "acks",
            {"imroute.acked": len(pushed.acked), "imroute.unacked": len(pushed.unacked or ())},
        )
