"""The `message.unacked` webhook event: a stored message that none of a recipient's
devices acked within IMROUTE_WEBHOOK_UNACKED_S, so the app can send FCM/APNs instead.

When a stored P2P push or multicast records its receipt, it is put in a due set, at
the time the wait ends. Every push service runs a sweeper: it claims due pushes in one
script (leased, so two sweepers never take the same push, and one that dies has its
claim taken over when the lease ends), reads who has not acked (the receipt's states,
or the pending set of a push too large to keep them), emits one event per 1000 of them
to the webhook outbox, and settles the push: it is never due again, so each (push,
recipient) fires once. Event ids are `unacked:<push_id>:<n>`: a sweeper that died
between emitting and settling re-emits the same ids, which receivers dedupe.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from router.webhook.base import Event, EventSink
from shared.clock import Clock
from shared.periodic import Periodic

__all__ = ["EVENT_UIDS", "UnackedDue", "UnackedSweeper"]

log = logging.getLogger(__name__)

EVENT_UIDS = 1000  # recipients per event at most
CLAIM_LIMIT = 100  # pushes per claim
LEASE_MS = 30_000


class UnackedDue(Protocol):
    async def claim_due(self, now_ms: int, lease_ms: int, limit: int) -> list[str]: ...
    async def unacked(self, push_id: str) -> list[str]: ...
    async def meta(self, push_id: str) -> dict[str, str]: ...
    async def settle(self, push_id: str) -> None: ...


def unacked_events(
    push_id: str, meta: dict[str, str], uids: Sequence[str], ts_ms: int
) -> list[Event]:
    """The events naming `uids` (pure): one per EVENT_UIDS, numbered from 0."""
    data = {
        "push_id": push_id,
        "msg_id": meta.get("mi", ""),
        "msg_type": int(meta.get("mt", "0")),
        "from": meta.get("fr", ""),
        "preview": meta.get("pv"),
    }
    return [
        Event(
            "message.unacked",
            f"unacked:{push_id}:{n}",
            ts_ms,
            {**data, "uids": list(uids[start : start + EVENT_UIDS])},
        )
        for n, start in enumerate(range(0, len(uids), EVENT_UIDS))
    ]


class UnackedSweeper:
    def __init__(
        self, due: UnackedDue, sink: EventSink, clock: Clock, every_s: float = 1.0
    ) -> None:
        self._due = due
        self._sink = sink
        self._clock = clock
        self._every_s = every_s
        self.events = 0  # message.unacked events this sweeper emitted
        self.recipients = 0  # recipients they named

    async def sweep(self) -> int:
        """One pass: every due push claimed, its event emitted, and settled; how many."""
        ids = await self._due.claim_due(self._clock.now_ms(), LEASE_MS, CLAIM_LIMIT)
        for push_id in ids:
            meta = await self._due.meta(push_id)
            uids = await self._due.unacked(push_id) if meta else []
            events = unacked_events(push_id, meta, uids, self._clock.now_ms())
            if events:
                await self._sink.emit(events)
                self.events += len(events)
                self.recipients += len(uids)
            await self._due.settle(push_id)
        return len(ids)

    async def _sweep_all(self) -> None:
        while await self.sweep() >= CLAIM_LIMIT:
            pass  # a backlog: go on at once

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[UnackedSweeper]:
        """Sweep every `every_s` while the block runs (a failed sweep is tried again)."""
        async with Periodic("message.unacked sweep", self._sweep_all, self._every_s, log=log):
            yield self
