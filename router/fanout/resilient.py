"""The bus and batch log as push jobs use them: retries with backoff, stable batch ids.

Batches of a push job may be published more than once: a retried publish whose first
attempt reached the bus after all, or the page a resumed job publishes again because its
previous process died between logging or publishing it and recording its checkpoint.
Gateways drop a batch id they have seen (`socket_gateway.dedup`), so each batch gets an
id derived from what it delivers (push id, mode, group, recipients), the same in every
attempt and in every process, on the bus (`ResilientPublisher`) and in the recovery log
(`StableIdLog`, whose entry a gateway may read instead when the bus lost the batch): a
batch published twice reaches each client once.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from router.fanout.publisher import Publisher, ReportsLosses
from router.recovery.base import ContentWrites, RecoveryLog
from shared.backoff import backoff_s
from shared.errors import BusUnavailable
from shared.models import Message
from shared.proto import gateway_pb2
from shared.tracing import current_span

__all__ = ["PublishRetry", "ResilientPublisher", "StableIdLog", "stable_batch_id"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PublishRetry:
    """`retries` more attempts after the first, waiting `backoff_s`, doubling, at most
    `max_backoff_s`, between them."""

    retries: int = 3
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0

    def delays(self) -> list[float]:
        return [
            backoff_s(n, self.backoff_s, self.max_backoff_s, rand=None)
            for n in range(1, self.retries + 1)
        ]


def stable_batch_id(batch: gateway_pb2.Batch) -> str:
    """32 hex characters (as `new_id`) that depend only on what the batch delivers."""
    h = hashlib.blake2b(digest_size=16)
    m = batch.message
    head = (m.push_id, str(batch.mode), batch.group_id, "1" if batch.everyone else "0")
    h.update("\0".join(head).encode())
    for uid in batch.uids:
        h.update(b"\0")
        h.update(uid.encode())
    return h.hexdigest()


class ResilientPublisher:
    """Wraps the bus for one push: stable batch ids, and bounded retries on BusUnavailable.

    A publish returns once the bus took the batch, or raises the last error after its
    retries; other errors (a batch the bus refuses as too large) are not retried.
    """

    def __init__(
        self,
        bus: Publisher,
        policy: PublishRetry,
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self._bus = bus
        self._policy = policy
        self._sleep = sleep
        # What the bus lost after publishing (BatchPublisher moves it to failed_batches)
        # is the bus's to say: passed through, when it says it.
        if isinstance(bus, ReportsLosses):
            self.losses = bus.losses

    async def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None
    ) -> str:
        data, attributes = _stable(data, attributes)
        delays = self._policy.delays()
        attempt = 0
        while True:
            try:
                return await self._bus.publish(topic, data, attributes)
            except BusUnavailable as exc:
                if attempt >= len(delays):
                    raise
                log.warning(
                    "publish to %s failed (attempt %d of %d), retrying in %.1f s: %s",
                    topic,
                    attempt + 1,
                    len(delays) + 1,
                    delays[attempt],
                    exc,
                )
                await self._sleep(delays[attempt])
                attempt += 1


def _stable(
    data: bytes, attributes: Mapping[str, str] | None
) -> tuple[bytes, Mapping[str, str] | None]:
    """The batch re-encoded under its stable id (about 70 us for 1000 uids)."""
    if attributes is None or "batch_id" not in attributes:
        return data, attributes  # not a batch (nothing else is published today)
    batch = gateway_pb2.Batch.FromString(data)
    batch.batch_id = stable_batch_id(batch)
    current_span().set_attribute("imroute.batch_id", batch.batch_id)  # as sent (traced)
    return batch.SerializeToString(), {**attributes, "batch_id": batch.batch_id}


class StableIdLog:
    """The recovery log for one push job: each batch logged under its stable id.

    BatchPublisher logs a batch before it publishes it, so the id set here is also the
    one the bus carries.
    """

    def __init__(self, log: RecoveryLog) -> None:
        self._log = log

    async def append_batch(self, topic: str, batch: gateway_pb2.Batch) -> int:
        batch.batch_id = stable_batch_id(batch)
        return await self._log.append_batch(topic, batch)

    @property
    def content(self) -> ContentWrites:
        return self._log.content

    async def append_p2p(self, message: Message, uids: Sequence[str], expires_ms: int) -> list[int]:
        return await self._log.append_p2p(message, uids, expires_ms)

    async def append_queued(
        self, message: Message, uids: Sequence[str], expires_ms: int
    ) -> tuple[list[int], int]:
        return await self._log.append_queued(message, uids, expires_ms)

    async def append_queued_many(
        self, items: Sequence[tuple[Message, Sequence[str], int]]
    ) -> list[tuple[list[int], int]]:
        return await self._log.append_queued_many(items)

    async def queue(self, message: Message, expires_ms: int, seqs: Mapping[str, int]) -> int:
        return await self._log.queue(message, expires_ms, seqs)

    async def forget_inboxes(self, wanted: Sequence[tuple[str, Sequence[int]]]) -> list[None]:
        return await self._log.forget_inboxes(wanted)
