"""P2P pushes: messages, each to 1-1000 users, delivered wherever they are connected;
their receipts recorded; with `wait_ack_ms`, the acks waited for. One API for any
number of messages (`Pushes.push`): POST /v1/push is a batch of one."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from push_service.content import new_message
from push_service.schemas import PushIn
from router.p2p.plan import Outgoing, PushOutcome
from router.p2p.pusher import P2PPusher
from router.receipts.base import (
    NewReceipt,
    ReceiptLimits,
    ReceiptLog,
    ReceiptReads,
    message_meta,
    p2p_receipt,
    split_acked,
)
from router.receipts.wait import wait_acks
from shared.clock import Clock
from shared.errors import ImrouteError, InvalidInput
from shared.logs import bind, unbind
from shared.models import Message
from shared.throttled import ThrottledLine
from shared.tracing import AttributeValue, Span, current_span

__all__ = ["Pushed", "Pushes", "Receipts"]

log = logging.getLogger(__name__)

# What a Redis in trouble costs pushes that went out (each push's, in an outage), each
# line once per 10 s with the count.
_UNRECORDED = ThrottledLine(
    log, "could not record the receipts of %(n)d push(es), the last %(push_id)s: %(exc)s"
)
_ACKS_UNREAD = ThrottledLine(
    log,
    "could not read the acks of %(n)d push(es) (wait_ack_ms: answered with none acked), "
    "the last %(push_id)s: %(exc)s",
)


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
    # A uid's slot tag (`KeySchema.user_slot_tag`): a stored push whose receipt lists its
    # recipients takes its first recipient's in its push id (`shared.keys.slot_tagged`),
    # and its receipt derives their acks from their acked positions. None: never.
    slot_tag: Callable[[str], str] | None = None

    def tag(self, body: PushIn) -> str:
        """The slot tag of `body`'s push id ("": none)."""
        slot_tag = self.slot_tag
        if slot_tag is None or not body.store or len(body.to) > self.limits.max_recipients:
            return ""
        return slot_tag(body.to[0])

    def due_ms(self, now_ms: int, store: bool) -> int:
        """When a push's message.unacked is due (0: none; only stored messages)."""
        return (
            now_ms + self.unacked_ms if self.unacked_ms and store else 0
        )  # receipts that could not be written (the push itself went out)


class Pushes:
    """Builds each message once (content encoded at the edge) and pushes them P2P."""

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

    def check(self, body: PushIn, batch: bool = False) -> None:
        """What the push cannot have, before anything is sent (InvalidInput: 422); in a
        batch (`batch`), no `wait_ack_ms`: a batch waits for no acks."""
        if body.wait_ack_ms is None:
            return
        if batch:
            raise InvalidInput("wait_ack_ms", "not in a batch: use POST /v1/push")
        r = self._receipts
        if r is None:
            raise InvalidInput("wait_ack_ms", "receipts are off (IMROUTE_RECEIPTS_TTL_S=0)")
        if len(body.to) > r.limits.max_recipients:
            raise InvalidInput(
                "wait_ack_ms",
                f"at most {r.limits.max_recipients} recipients "
                "(IMROUTE_RECEIPTS_MAX_RECIPIENTS) keep per-recipient states",
            )

    def _tag(self, body: PushIn) -> str:
        r = self._receipts
        return "" if r is None else r.tag(body)

    async def push_one(self, body: PushIn, *, seed: str | None) -> Pushed:
        """POST /v1/push: `push` of a batch of one (its fast path), its error raised."""
        answer = await self._push_single(body, seed)
        if isinstance(answer, ImrouteError):
            raise answer
        return answer

    async def push(
        self, bodies: Sequence[PushIn], *, batch: bool = False, seed: str | None
    ) -> list[Pushed | ImrouteError]:
        """Deliver each body's message now to its recipients' live connections and queue
        it for the rest (stored), all at once (`P2PPusher.push`); record their receipts
        in one write; with `wait_ack_ms`, wait for the acks. Each one's answer, or the
        error that failed it alone. `batch`: the messages of POST /v1/push/batch (which
        refuses `wait_ack_ms`: a batch waits for no acks), counted and traced as such.
        `seed`: the request's id seed (`push_service.idempotency.http.Handler`)."""
        if len(bodies) == 1 and not batch:
            # POST /v1/push, the hottest path: no positions, lists and loops over a batch
            # (they cost it 7 % of its CPU in this process, by bench.p2p_inprocess).
            return [await self._push_single(bodies[0], seed)]
        answers: list[Pushed | ImrouteError | None] = [None] * len(bodies)
        items: list[Outgoing] = []
        where: list[int] = []
        now = self._clock.now_ms()
        for i, body in enumerate(bodies):
            try:
                self.check(body, batch)
                message = new_message(body, now, seed, i, self._tag(body))
            except ImrouteError as exc:
                answers[i] = exc
                continue
            items.append(Outgoing(message, body.to, _expires_ms(message, body), body.store))
            where.append(i)
        span = current_span() if self._traced else None
        if batch:
            self.batched += len(items)
            if span is not None:
                span.set_attributes({"imroute.mode": "p2p", "imroute.messages": len(items)})
            span = None
        elif span is not None and not span.is_recording():
            span = None  # this push not sampled
        if items:
            await self._push(bodies, items, where, answers, batch)
        if span is not None:
            for answer in answers:
                if isinstance(answer, Pushed):
                    _annotate(span, answer)
        return [a for a in answers if a is not None]

    async def _push_single(self, body: PushIn, seed: str | None) -> Pushed | ImrouteError:
        """`push` of one body, not in a batch."""
        try:
            self.check(body)
            message = new_message(body, self._clock.now_ms(), seed, 0, self._tag(body))
        except ImrouteError as exc:
            return exc
        # Every line logged while it is pushed (its retries included) names it.
        bound = bind(push_id=message.push_id, msg_id=message.msg_id)
        try:
            span = current_span() if self._traced else None
            if span is not None and not span.is_recording():
                span = None  # this push not sampled
            if span is not None:
                span.set_attributes(_span_ids(message, len(body.to)))
            item = Outgoing(message, body.to, _expires_ms(message, body), body.store)
            try:
                [outcome] = await self._pusher.push([item])
            except ImrouteError as exc:
                return exc
            if isinstance(outcome, ImrouteError):
                return outcome
            pushed = Pushed(message, outcome)
            self.pushed += 1
            self.queued += len(outcome.queued)
            r = self._receipts
            if r is not None:
                await self._record(r, [self._receipt(r, item, outcome)])
                if body.wait_ack_ms is not None:
                    pushed = await self._acked(r, pushed, body)
            if span is not None:
                _annotate(span, pushed)
            return pushed
        finally:
            unbind(bound)

    async def _push(
        self,
        bodies: Sequence[PushIn],
        items: Sequence[Outgoing],
        where: Sequence[int],
        answers: list[Pushed | ImrouteError | None],
        batch: bool,
    ) -> None:
        """`push` of the messages built: each one's answer into `answers`."""
        try:
            outcomes = await self._pusher.push(items)
        except ImrouteError as exc:
            outcomes = [exc] * len(items)
        r = self._receipts
        receipts: list[tuple[NewReceipt, bool, int]] = []
        pushed: list[tuple[int, Pushed]] = []
        for i, item, outcome in zip(where, items, outcomes, strict=True):
            if isinstance(outcome, ImrouteError):
                answers[i] = outcome
                continue
            answers[i] = done = Pushed(item.message, outcome)
            pushed.append((i, done))
            self.queued += len(outcome.queued)
            if r is not None:
                receipts.append(self._receipt(r, item, outcome))
        if not batch:
            self.pushed += len(pushed)
        if r is None:
            return
        if receipts:
            await self._record(r, receipts)
        for i, p in pushed:
            if bodies[i].wait_ack_ms is not None:  # never in a batch
                answers[i] = await self._acked(r, p, bodies[i])

    async def _record(self, r: Receipts, receipts: Sequence[tuple[NewReceipt, bool, int]]) -> None:
        """Record the pushes' receipts in one write; a failure is logged and counted."""
        try:
            await r.log.record_many(receipts)
        except ImrouteError as exc:
            # The pushes went out; only their receipts are missing (GET answers 404).
            _UNRECORDED.note(len(receipts), push_id=receipts[-1][0].push_id, exc=exc)

    async def _acked(self, r: Receipts, pushed: Pushed, body: PushIn) -> Pushed:
        """`pushed` with the recipients a device acked within `wait_ack_ms`, and the rest."""
        message, outcome = pushed.message, pushed.outcome
        online = [*outcome.delivered, *outcome.failed]
        wait_s = (body.wait_ack_ms or 0) / 1000
        try:
            states = await wait_acks(r.reads, message.push_id, online, body.to, wait_s, self._clock)
        except ImrouteError as exc:
            _ACKS_UNREAD.note(push_id=message.push_id, exc=exc)
            states = {}
        acked, unacked = split_acked(body.to, states)
        return Pushed(message, outcome, acked, unacked)

    def _receipt(
        self, r: Receipts, item: Outgoing, outcome: PushOutcome
    ) -> tuple[NewReceipt, bool, int]:
        """The push's receipt, whether it lists its recipients, when its message.unacked
        is due (0: none)."""
        listable = len(item.uids) <= r.limits.max_recipients
        now_ms = self._clock.now_ms()
        due_ms = r.due_ms(now_ms, item.store)
        # Only the message.unacked event reads the message's fields back.
        meta = message_meta(item.message, r.preview) if due_ms else {}
        ttl_passed = bool(item.expires_ms) and now_ms >= item.expires_ms
        receipt = p2p_receipt(item.message, item.uids, outcome, meta, item.store, ttl_passed)
        return receipt, listable, due_ms


def _expires_ms(message: Message, body: PushIn) -> int:
    """When a push's message expires (0: never): its ttl_s after it was made."""
    return message.ts_ms + body.ttl_s * 1000 if body.ttl_s else 0


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
