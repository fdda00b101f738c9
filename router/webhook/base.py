"""The webhooks' seam: an event, the sink producers emit into, and the wire format.

A request's body is ``{"events":[...]}``; each event is one JSON object with
``event_id``, ``type`` and ``ts`` (unix milliseconds) and its type's own fields
(docs/guides/webhooks.md). Delivery is at least once: receivers dedupe by ``event_id``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from shared.errors import InvalidInput

__all__ = ["RESERVED", "Event", "EventSink", "encode_event", "events_body"]

# The envelope's fields; a type's own fields (`Event.data`) may not reuse them.
RESERVED = frozenset({"event_id", "type", "ts"})


@dataclass(frozen=True, slots=True)
class Event:
    """One webhook event. `event_id` is chosen by the producer, deterministically, so an
    event emitted twice (a retried producer) is deduped by the receiver."""

    type: str  # "message.unacked" | "user.offline" | "user.online"
    event_id: str
    ts_ms: int
    data: Mapping[str, Any]  # the type's own fields, merged into the event's JSON object


class EventSink(Protocol):
    async def emit(self, events: Sequence[Event]) -> None:
        """Queue `events` for delivery: one Redis round trip at most, never an HTTP call.

        Events a full queue refuses are counted and logged, not raised: a producer on
        the push path never fails because a receiver is down. RegistryUnavailable when
        Redis did not answer; InvalidInput when `data` reuses an envelope field."""
        ...


def encode_event(event: Event) -> str:
    """The event's JSON object, compact; InvalidInput when `data` reuses an envelope field."""
    clash = RESERVED.intersection(event.data)
    if clash:
        raise InvalidInput("event.data", f"may not set {', '.join(sorted(clash))}")
    if not event.type or not event.event_id:
        raise InvalidInput("event", "type and event_id must be non-empty")
    obj = {"event_id": event.event_id, "type": event.type, "ts": event.ts_ms, **event.data}
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def events_body(encoded: Sequence[str]) -> bytes:
    """A request body of already-encoded events, without decoding them again."""
    return ('{"events":[' + ",".join(encoded) + "]}").encode()
