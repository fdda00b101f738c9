"""The fleet's webhook outbox: a Redis Stream every producer adds to, bounded, counted.

Producers (the push service's message.unacked, the gateways' and sweepers' presence
events) add events; every push service's sender reads them through one consumer group,
so each is sent by one of them, and deletes each once delivered. So the stream holds
only events not yet delivered, and its length is the queue's: past
IMROUTE_WEBHOOK_QUEUE_MAX, new events are refused, counted in ``{wh}:overflow`` and
logged (the oldest, owed longest, are kept).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from router.redis.scripts import ScriptRunner
from router.webhook.base import Event, encode_event
from router.webhook.scripts import EMIT
from shared.keys import KeySchema

__all__ = ["OutboxStats", "RedisOutbox"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class OutboxStats:
    queued: int  # events not yet delivered, fleet-wide
    overflowed: int  # events refused by a full outbox, fleet-wide, ever


class RedisOutbox:
    """An `EventSink`: `emit` is one script call, one round trip, however many events."""

    def __init__(self, redis: RedisClient, keys: KeySchema, maxlen: int) -> None:
        self._redis = redis
        self._keys = (keys.webhook_events(), keys.webhook_overflow())
        self._maxlen = maxlen
        self._scripts = ScriptRunner(redis, (EMIT,))
        self.overflowed = 0  # refused here, by this process

    async def emit(self, events: Sequence[Event]) -> None:
        """Queue `events`; RegistryUnavailable when Redis did not answer."""
        if not events:
            return
        encoded = [encode_event(e) for e in events]
        added = await self._add(encoded)
        if added < len(encoded):
            self.overflowed += len(encoded) - added
            log.warning(
                "webhook outbox full (IMROUTE_WEBHOOK_QUEUE_MAX=%d): %d of %d events dropped",
                self._maxlen,
                len(encoded) - added,
                len(encoded),
            )

    @translate_errors
    async def _add(self, encoded: list[str]) -> int:
        added = await self._scripts.run(EMIT, self._keys, self._maxlen, *encoded)
        return int(added)

    @translate_errors
    async def stats(self) -> OutboxStats:
        pipe = self._redis.pipeline(transaction=False)
        pipe.xlen(self._keys[0])
        pipe.get(self._keys[1])
        queued, overflowed = await pipe.execute()
        return OutboxStats(int(queued), int(overflowed or 0))
