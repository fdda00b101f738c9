"""One sender's side of the outbox's consumer group (`router.webhook.outbox`).

Each push service reads as its own consumer of the group ``senders``: XREADGROUP hands
each entry to one of them, so the fleet sends each event once (at least once: a sender
that dies holding entries loses them to another one's XAUTOCLAIM once they have been
idle `claim_idle_ms`; a sender still retrying them touches them first, so they never
look idle while it does). A delivered (or dropped) entry is acked and deleted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.exceptions

from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from shared.keys import KeySchema

__all__ = ["GROUP", "Entry", "OutboxConsumer"]

GROUP = "senders"
READ_BLOCK_MS = 1000


@dataclass(frozen=True, slots=True)
class Entry:
    entry_id: str
    event: str  # the event's JSON object


class OutboxConsumer:
    def __init__(
        self, redis: RedisClient, keys: KeySchema, consumer: str, claim_idle_ms: int
    ) -> None:
        self._redis = redis
        self._stream = keys.webhook_events()
        self.consumer = consumer
        self.claim_idle_ms = claim_idle_ms

    @translate_errors
    async def ensure_group(self) -> None:
        """Create the group if it is missing, from the stream's start: events added
        before any sender ran (or while Redis lost the group) are still sent."""
        try:
            await self._redis.xgroup_create(self._stream, GROUP, id="0", mkstream=True)
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    @translate_errors
    async def read(self, count: int) -> list[Entry]:
        """New entries for this consumer; waits up to READ_BLOCK_MS for one."""
        try:
            reply: Any = await self._redis.xreadgroup(
                GROUP, self.consumer, {self._stream: ">"}, count=count, block=READ_BLOCK_MS
            )
        except redis.exceptions.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await self.ensure_group()  # Redis lost the stream or the group: make it again
            return []
        if not reply:
            return []
        return await self._usable(reply[0][1])

    @translate_errors
    async def claim_idle(self, count: int) -> list[Entry]:
        """Entries other consumers (dead senders) held idle for `claim_idle_ms`."""
        try:
            reply: Any = await self._redis.xautoclaim(
                self._stream, GROUP, self.consumer, self.claim_idle_ms, "0-0", count=count
            )
        except redis.exceptions.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            return []
        return await self._usable(reply[1])

    @translate_errors
    async def touch(self, entries: list[Entry]) -> None:
        """Reset the entries' idle time: this sender still works on them. Redis lost the
        stream or the group: nothing is held any more (the group is made again)."""
        try:
            await self._redis.xclaim(
                self._stream, GROUP, self.consumer, 0, [e.entry_id for e in entries], justid=True
            )
        except redis.exceptions.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await self.ensure_group()

    @translate_errors
    async def done(self, entries: list[Entry]) -> None:
        """Delivered or dropped: ack and delete them, in one round trip."""
        ids = [e.entry_id for e in entries]
        if not ids:
            return
        pipe = self._redis.pipeline(transaction=False)
        pipe.xack(self._stream, GROUP, *ids)
        pipe.xdel(self._stream, *ids)
        await pipe.execute()  # XACK and XDEL of what Redis lost answer 0, not an error

    async def _usable(self, raw: list[Any]) -> list[Entry]:
        entries, broken = [], []
        for entry_id, fields in raw:
            event = (fields or {}).get("e")
            if isinstance(event, str) and event:
                entries.append(Entry(entry_id, event))
            else:  # deleted meanwhile, or not an event: nothing to send
                broken.append(Entry(entry_id, ""))
        if broken:
            await self.done(broken)
        return entries
