"""P2P pushes: one message to 1-1000 users, delivered over gRPC wherever they are connected."""

from __future__ import annotations

from dataclasses import dataclass

from push_service.content import new_message
from push_service.schemas import PushIn
from router.p2p.plan import PushOutcome
from router.p2p.pusher import P2PPusher
from shared.clock import Clock
from shared.models import Message

__all__ = ["Pushed", "Pushes"]


@dataclass(frozen=True, slots=True)
class Pushed:
    """A P2P push's message (its ids) and what became of each recipient."""

    message: Message
    outcome: PushOutcome


class Pushes:
    """Builds the message once (content encoded at the edge) and pushes it P2P."""

    def __init__(self, pusher: P2PPusher, clock: Clock) -> None:
        self._pusher = pusher
        self._clock = clock

    async def push(self, body: PushIn) -> Pushed:
        """Deliver now to every recipient's live connections; queue the rest (stored)."""
        message = new_message(body, self._clock.now_ms())
        expires_ms = message.ts_ms + body.ttl_s * 1000 if body.ttl_s else 0
        outcome = await self._pusher.push(message, body.to, expires_ms, store=body.store)
        return Pushed(message, outcome)
