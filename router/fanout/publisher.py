"""What broadcast and multicast hand their batches to: a topic, the bytes, attributes.

Batches are encoded once here; every bus transport (and, later, every hedged attempt)
sends the same bytes. Content over IMROUTE_BUS_CONTENT_INLINE_MAX is stored once per
push before its first batch, and the batches name it (`router.recovery.content`).

A batch the bus lost after it was published (Redis Streams trimmed it past
IMROUTE_BUS_MAXLEN before a live gateway read it) moves from `published` to
`failed_batches`: the bus reports it (`BusLosses`), and each publish takes the push's
lost batches so far. A batch whose publish failed after it was logged apart (Pub/Sub)
is no failure: the gateways read it from the log, late; it counts as published, and the
next batches of every job go to the log alone for BUS_RETRY_S before the bus is tried
again.

A batch of a push job may be published more than once: a publish whose first attempt
reached the bus after all, or the page a resumed job publishes again because its previous
process died between logging or publishing it and recording its checkpoint. Gateways
drop a batch id they have seen (`socket_gateway.delivery`), so each batch gets its id where
it is built, derived from what it delivers (push id, mode, group, recipients): the same
in every attempt and in every process, on the bus and in the recovery log (whose entry
a gateway may read instead when the bus lost the batch). A batch published twice
reaches each client once.
"""

from __future__ import annotations

import hashlib
import logging
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Protocol, runtime_checkable

from router.bus.base import BROADCAST, NEXT_SEQ, SEQ, group_topic
from router.bus.losses import BusLosses
from router.fanout.outages import ride_out
from router.jobs.base import PushCounters
from router.recovery.base import OFFLINE_TOPIC, ContentWrites, RecoveryLog
from shared.batches import to_batch
from shared.errors import ImrouteError
from shared.models import Message
from shared.positions import counter_of, epoch_of
from shared.proto import gateway_pb2
from shared.throttled import ThrottledLine
from shared.tracing import (
    TRACEPARENT,
    AttributeValue,
    Span,
    SpanKind,
    Tracer,
    traced,
    traceparent,
)

__all__ = [
    "BROADCAST_TOPIC",
    "BatchPublisher",
    "LogsTopics",
    "Publisher",
    "PushCounters",
    "ReportsLosses",
    "group_topic",
    "stable_batch_id",
]

log = logging.getLogger(__name__)

# After a failed publish of a batch logged apart, every job leaves that bus alone this
# long, its batches in the log only: a bus that stays down costs no publish timeout per
# batch. When each bus is tried again:
BUS_RETRY_S = 10.0
_BUS_BACK_AT: weakref.WeakKeyDictionary[Publisher, float] = weakref.WeakKeyDictionary()
# Batches logged apart whose publish failed or was not tried, process-wide: the gateways
# write them from the topic's recovery log (while Pub/Sub is down, every batch).
FROM_LOG = ThrottledLine(
    log,
    "%(n)d batch(es) of %(topic)s not published (%(exc)s) since the last line; they are in "
    "the topic's recovery log, from which the gateways write them (%(total)d in all)",
)

BROADCAST_TOPIC = BROADCAST


class Publisher(Protocol):
    """The publishing half of the bus."""

    async def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None
    ) -> str: ...


@runtime_checkable
class LogsTopics(Protocol):
    """A bus whose publish logs the batch in its topic's recovery log too (every
    HedgedBus says whether it does; test doubles that only publish do not)."""

    @property
    def logs_topics(self) -> bool: ...


@runtime_checkable
class ReportsLosses(Protocol):
    """A bus that says what it lost after publishing: every HedgedBus (test doubles
    that only publish need not)."""

    @property
    def losses(self) -> BusLosses: ...


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


@dataclass(slots=True, eq=False)
class BatchPublisher:
    """Builds one Batch per call, encodes it once and publishes it to its topic.

    With `recovery`, each batch is logged in its topic's batch log (one entry per
    batch) before it is published, and carries its seq there; unless the bus logs it
    itself (`LogsTopics`: the Redis Streams bus on the recovery store's Redis, whose
    stream is the topic's log): then the publish asks for the entry's place (SEQ) and is
    the one write. Without `recovery` (`store: false`) nothing is logged either way.
    With `content` (or `recovery`'s), content it `stores` is written once and the
    batches name it. With `tracer`, each batch's publish is a span its gateways' spans
    name as their parent (the message attribute `traceparent`)."""

    publisher: Publisher
    message: Message
    expires_ms: int
    counters: PushCounters
    recovery: RecoveryLog | None = None
    _: KW_ONLY
    content: ContentWrites | None = None
    tracer: Tracer | None = None
    _store: ContentWrites | None = field(init=False, repr=False)  # where content goes once
    _bare: Message = field(init=False, repr=False)  # what batches carry when stored
    _losses: BusLosses | None = field(init=False, repr=False)
    _log_apart: RecoveryLog | None = field(init=False, repr=False)  # the bus does not log
    _log_on_bus: bool = field(init=False, repr=False)  # each publish asks for its place

    def __post_init__(self) -> None:
        content = self.content
        if content is None and self.recovery is not None:
            content = self.recovery.content
        self._store = content if content and content.stores(self.message.content_json) else None
        self._bare = replace(self.message, content_json=b"")
        self._losses = self.publisher.losses if isinstance(self.publisher, ReportsLosses) else None
        on_bus = isinstance(self.publisher, LogsTopics) and self.publisher.logs_topics
        self._log_apart = None if on_bus else self.recovery
        self._log_on_bus = on_bus and self.recovery is not None

    async def record_offline(self, uids: Sequence[str]) -> None:
        """Log recipients who had no route (one entry for all of them), so that a client
        resuming within the window gets the message; nothing is published."""
        recovery = self.recovery
        if recovery is not None and uids:
            batch = await self._batch(uids, gateway_pb2.MODE_MULTICAST)
            await ride_out(
                lambda: recovery.append_batch(OFFLINE_TOPIC, batch), "logging the offline"
            )

    async def publish(
        self,
        mode: gateway_pb2.Mode.ValueType,
        topic: str,
        uids: Sequence[str] = (),
        *,
        group_id: str = "",
        everyone: bool = False,
    ) -> None:
        tracer = traced(self.tracer)
        if tracer is None:
            await self._publish(mode, topic, uids, group_id, everyone, None)
            return
        attributes: dict[str, AttributeValue] = {
            "imroute.topic": topic,
            "imroute.mode": gateway_pb2.Mode.Name(mode),
            "imroute.recipients": len(uids),
        }
        if everyone:
            attributes["imroute.everyone"] = True
        with tracer.start_as_current_span(
            "bus.publish", kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            await self._publish(mode, topic, uids, group_id, everyone, span)

    async def _publish(
        self,
        mode: gateway_pb2.Mode.ValueType,
        topic: str,
        uids: Sequence[str],
        group_id: str,
        everyone: bool,
        span: Span | None,
    ) -> None:
        batch = await self._batch(uids, mode, group_id, everyone)
        attributes = {
            "batch_id": batch.batch_id,
            "push_id": self.message.push_id,
            "mode": gateway_pb2.Mode.Name(mode),
            "group_id": group_id,
        }
        if self._log_apart is not None:
            recovery = self._log_apart
            seq = await ride_out(
                lambda: recovery.append_batch(topic, batch), f"logging a batch of {topic}"
            )
            batch.seq, batch.epoch = counter_of(seq), epoch_of(seq)
        elif self._log_on_bus:
            attributes[SEQ] = NEXT_SEQ  # the publish gives the entry its place in the log
        if span is not None:
            span.set_attribute("imroute.batch_id", batch.batch_id)
            attributes[TRACEPARENT] = traceparent(span)
        self.counters.batches += 1
        if group_id:
            self.counters.per_group[group_id] = self.counters.per_group.get(group_id, 0) + 1
        if self._log_apart is not None and time.monotonic() < _BUS_BACK_AT.get(self.publisher, 0.0):
            FROM_LOG.note(topic=topic, exc=f"the bus failed a publish within {BUS_RETRY_S:g} s")
            self.counters.published += 1
            return
        try:
            await self.publisher.publish(topic, batch.SerializeToString(), attributes)
        except ImrouteError as exc:
            if self._log_apart is None:
                # Counted before the error ends the job, so its record says which batch
                # failed. (A cancelled publish, at shutdown, is no failure: not counted.)
                self.counters.failed_batches += 1
                raise
            # Logged apart before the publish: the gateways following the topic find it
            # in the log (a gap before the next batch, or the head they poll) and write
            # it from there, late. Listed as failed, it would be sent again, twice.
            FROM_LOG.note(topic=topic, exc=exc)
            _BUS_BACK_AT[self.publisher] = time.monotonic() + BUS_RETRY_S
        except Exception:
            self.counters.failed_batches += 1
            raise
        self.counters.published += 1
        self.take_losses()

    def take_losses(self) -> int:
        """Move the push's batches the bus lost since the last call from `published` to
        `failed_batches`; how many."""
        if self._losses is None:
            return 0
        lost = self._losses.take(self.message.push_id)
        self.counters.published -= lost
        self.counters.failed_batches += lost
        return lost

    async def _batch(
        self,
        uids: Sequence[str],
        mode: gateway_pb2.Mode.ValueType,
        group_id: str = "",
        everyone: bool = False,
    ) -> gateway_pb2.Batch:
        """The batch for `uids`, under its stable id."""
        if self._store is None:
            batch = to_batch(self.message, uids, "")
        else:
            # Stored (or its TTL pushed forward) before the batch that names it can exist.
            content, m = self._store, self.message
            await ride_out(
                lambda: content.hold(m.msg_id, m.content_json), "storing a push's content"
            )
            batch = to_batch(self._bare, uids, "")
            batch.message.content_stored = True
        batch.mode = mode
        batch.group_id = group_id
        batch.everyone = everyone
        batch.expires_ms = self.expires_ms
        batch.batch_id = stable_batch_id(batch)
        return batch
