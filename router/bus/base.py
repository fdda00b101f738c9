"""The message bus seam: topics, what a subscriber receives, and the Bus protocol.

The push service publishes broadcast and group-multicast batches; every gateway
subscribes, under its gateway id, to `broadcast` and to `group.<its group id>`.
Delivery is at least once, per subscriber:

- a subscriber gets every message published to its topics after it first
  subscribed (`prepare` or the first read of `subscribe`), never earlier ones,
  so gateways prepare their subscriptions before they announce themselves;
- a message stays owed to the subscriber until `Received.ack()`; a subscriber
  that restarts under the same id gets its unacked messages again, and one not
  acked within the transport's ack deadline may come again even without a restart;
- order is not promised across topics, nor (with every transport) within one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, Self

from shared.errors import BusUnavailable, InvalidInput
from shared.keys import ID_PATTERN, validate_id

__all__ = [
    "BROADCAST",
    "GROUP_PREFIX",
    "Bus",
    "BusUnavailable",
    "Received",
    "group_topic",
    "validate_subscription",
    "validate_topic",
]

BROADCAST = "broadcast"
GROUP_PREFIX = "group."


@dataclass(frozen=True, slots=True)
class Received:
    """One message as a subscriber gets it; ack it once it was written to local sockets."""

    topic: str
    data: bytes
    attributes: Mapping[str, str]
    message_id: str
    acker: Callable[[], Awaitable[None]] = field(repr=False, compare=False)

    async def ack(self) -> None:
        """Tell the bus this subscriber is done with the message, so it is not delivered again."""
        await self.acker()


class Bus(Protocol):
    """Topic fan-out with per-subscriber acks: the push service publishes, gateways subscribe."""

    async def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None
    ) -> str: ...

    async def prepare(self, topics: Sequence[str], subscriber: str) -> None: ...

    def subscribe(self, topics: Sequence[str], subscriber: str) -> AsyncIterator[Received]: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


def validate_topic(topic: str) -> str:
    """Return `topic` if it is `broadcast` or `group.<group_id>`, else raise InvalidInput."""
    if topic == BROADCAST or (
        topic.startswith(GROUP_PREFIX) and ID_PATTERN.fullmatch(topic.removeprefix(GROUP_PREFIX))
    ):
        return topic
    raise InvalidInput(
        "topic",
        f"{topic!r} is neither {BROADCAST!r} nor '{GROUP_PREFIX}<group_id>' "
        "(group_id: 1-64 letters, digits, '_', '.' or '-')",
    )


def group_topic(group_id: str) -> str:
    """The topic of one gateway group."""
    return GROUP_PREFIX + validate_id("group_id", group_id)


def validate_subscription(topics: Sequence[str], subscriber: str) -> tuple[str, ...]:
    """Check a subscription's arguments; returns its topics without duplicates."""
    # A bare string is a Sequence[str] too, and would subscribe to its characters.
    if isinstance(topics, str):
        raise InvalidInput("topics", "must be a list of topics, not one string")
    if not topics:
        raise InvalidInput("topics", "at least one topic is needed")
    validate_id("subscriber", subscriber)
    return tuple(dict.fromkeys(validate_topic(t) for t in topics))
