"""What broadcast and multicast hand their batches to: a topic, the bytes, attributes.

Batches are encoded once here; every bus transport (and, later, every hedged attempt)
sends the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from router.bus.base import BROADCAST, group_topic
from router.jobs.base import PushCounters
from router.recovery.base import OFFLINE_TOPIC, RecoveryLog
from shared.batches import to_batch
from shared.ids import new_id
from shared.models import Message
from shared.proto import gateway_pb2

__all__ = ["BROADCAST_TOPIC", "BatchPublisher", "Publisher", "PushCounters", "group_topic"]

BROADCAST_TOPIC = BROADCAST


class Publisher(Protocol):
    """The publishing half of the bus."""

    async def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None
    ) -> str: ...


class BatchPublisher:
    """Builds one Batch per call, encodes it once and publishes it to its topic."""

    def __init__(
        self,
        publisher: Publisher,
        message: Message,
        expires_ms: int,
        counters: PushCounters,
        recovery: RecoveryLog | None = None,
    ) -> None:
        """With `recovery`, each batch is logged in its topic's batch log (one entry per
        batch) before it is published, and carries its seq there."""
        self._publisher = publisher
        self._message = message
        self._expires_ms = expires_ms
        self.counters = counters
        self._recovery = recovery

    async def record_offline(self, uids: Sequence[str]) -> None:
        """Log recipients who had no route (one entry for all of them), so that a client
        resuming within the window gets the message; nothing is published."""
        if self._recovery is not None and uids:
            batch = to_batch(self._message, uids, new_id())
            batch.mode = gateway_pb2.MODE_MULTICAST
            batch.expires_ms = self._expires_ms
            await self._recovery.append_batch(OFFLINE_TOPIC, batch)

    async def publish(
        self,
        mode: gateway_pb2.Mode.ValueType,
        topic: str,
        uids: Sequence[str] = (),
        *,
        group_id: str = "",
        everyone: bool = False,
    ) -> None:
        batch = to_batch(self._message, uids, new_id())
        batch.mode = mode
        batch.group_id = group_id
        batch.everyone = everyone
        batch.expires_ms = self._expires_ms
        attributes = {
            "batch_id": batch.batch_id,
            "push_id": self._message.push_id,
            "mode": gateway_pb2.Mode.Name(mode),
            "group_id": group_id,
        }
        if self._recovery is not None:
            batch.seq = await self._recovery.append_batch(topic, batch)
        self.counters.batches += 1
        if group_id:
            self.counters.per_group[group_id] = self.counters.per_group.get(group_id, 0) + 1
        try:
            await self._publisher.publish(topic, batch.SerializeToString(), attributes)
        except Exception:
            # Counted before the error ends the job, so its record says which batch failed.
            # A cancelled publish (shutdown) is not a failure of the bus: not counted.
            self.counters.failed_batches += 1
            raise
        self.counters.published += 1
