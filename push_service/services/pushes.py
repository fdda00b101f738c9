"""P2P pushes: one message to 1-1000 users, delivered over gRPC wherever they are
connected; its receipt recorded; with `wait_ack_ms`, the acks waited for."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from push_service.content import new_message
from push_service.schemas import PushIn
from router.p2p.plan import PushOutcome
from router.p2p.pusher import P2PPusher
from router.receipts.base import ReceiptLimits, ReceiptLog, ReceiptReads
from router.receipts.record import message_meta, p2p_receipt, split_acked
from router.receipts.wait import wait_acks
from shared.clock import Clock
from shared.errors import ImrouteError, InvalidInput
from shared.models import Message

__all__ = ["Pushed", "Pushes", "Receipts"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
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

    def __init__(self, pusher: P2PPusher, clock: Clock, receipts: Receipts | None = None) -> None:
        self._pusher = pusher
        self._clock = clock
        self._receipts = receipts

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

    async def push(self, body: PushIn) -> Pushed:
        """Deliver now to every recipient's live connections; queue the rest (stored)."""
        self.check(body)
        message = new_message(body, self._clock.now_ms())
        expires_ms = message.ts_ms + body.ttl_s * 1000 if body.ttl_s else 0
        outcome = await self._pusher.push(message, body.to, expires_ms, store=body.store)
        r = self._receipts
        if r is None:
            return Pushed(message, outcome)
        listable = len(body.to) <= r.limits.max_recipients
        meta = message_meta(message, r.preview)
        ttl_passed = bool(expires_ms) and self._clock.now_ms() >= expires_ms
        receipt = p2p_receipt(message, body.to, outcome, meta, body.store, ttl_passed)
        try:
            due = r.due_ms(self._clock.now_ms(), body.store)
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
