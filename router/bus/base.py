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
- order is not promised across topics, nor (with every transport) within one;
- a message is bytes plus string attributes within Pub/Sub's limits (10 MB in all,
  at most 100 attributes), on every transport, so a stack can switch transports.
"""

from __future__ import annotations

import asyncio
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Coroutine,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

from router.bus.losses import BusLosses
from shared.closing import ClosedOnExit
from shared.errors import BusUnavailable, InvalidInput, PayloadTooLarge
from shared.keys import ID_PATTERN, validate_id

__all__ = [
    "BROADCAST",
    "EPOCH",
    "GROUP_PREFIX",
    "MAX_MESSAGE_BYTES",
    "NEXT_SEQ",
    "SEQ",
    "Bus",
    "BusLifecycle",
    "BusUnavailable",
    "ClosedOnExit",
    "Received",
    "Subscriptions",
    "group_topic",
    "until_closed",
    "validate_message",
    "validate_subscription",
    "validate_topic",
]

T = TypeVar("T")

BROADCAST = "broadcast"
GROUP_PREFIX = "group."

# The attributes of an entry that the publish logged in its topic's recovery log: its
# counter and epoch there (`shared.positions`), given by the publish itself. A publisher
# asks for it with SEQ set to NEXT_SEQ, on a bus that `logs_topics` only.
SEQ = "seq"
EPOCH = "epoch"
NEXT_SEQ = "next"

# Every transport takes what Pub/Sub takes (cloud.google.com/pubsub/quotas), so a stack
# can move from one to the other: data and attributes together at most 10 MB, at most
# 100 attributes, keys of 1-256 bytes not starting with "goog", values of at most 1024.
MAX_MESSAGE_BYTES = 10_000_000
MAX_ATTRIBUTES = 100
MAX_ATTRIBUTE_KEY_BYTES = 256
MAX_ATTRIBUTE_VALUE_BYTES = 1024


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


class Subscriptions(Protocol):
    """What a Bus and each of its transports both offer: subscribing, and closing."""

    async def prepare(self, topics: Sequence[str], subscriber: str) -> None: ...

    async def leave(self, topics: Sequence[str], subscriber: str) -> None:
        """The subscriber stopped for good (a clean stop): what is published from here on
        is not kept for it, nor counted lost when it is never read."""
        ...

    def subscribe(
        self, topics: Sequence[str], subscriber: str
    ) -> AsyncGenerator[Received, None]: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class Bus(Subscriptions, Protocol):
    """Topic fan-out with per-subscriber acks: the push service publishes, gateways subscribe."""

    async def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None
    ) -> str: ...

    @property
    def losses(self) -> BusLosses:
        """What the bus lost after publishing: entries trimmed before a live subscriber
        had read them (router.bus.losses)."""
        ...


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


def validate_message(data: bytes, attributes: Mapping[str, str] | None) -> None:
    """Refuse, before anything is sent, a message Pub/Sub would refuse."""
    attributes = attributes or {}
    if not data and not attributes:
        raise InvalidInput("data", "a message needs data or at least one attribute")
    if len(attributes) > MAX_ATTRIBUTES:
        raise InvalidInput(
            "attributes", f"{len(attributes)} attributes, at most {MAX_ATTRIBUTES} allowed"
        )
    size = len(data)
    for key, value in attributes.items():
        key_bytes, value_bytes = len(key.encode()), len(value.encode())
        if not key or key_bytes > MAX_ATTRIBUTE_KEY_BYTES or key.startswith("goog"):
            raise InvalidInput(
                "attributes",
                f"key {key[:40]!r}: 1-{MAX_ATTRIBUTE_KEY_BYTES} bytes, not starting with 'goog'",
            )
        if value_bytes > MAX_ATTRIBUTE_VALUE_BYTES:
            raise InvalidInput(
                "attributes",
                f"value of {key!r} is {value_bytes} bytes, "
                f"at most {MAX_ATTRIBUTE_VALUE_BYTES} allowed",
            )
        size += key_bytes + value_bytes
    if size > MAX_MESSAGE_BYTES:
        raise PayloadTooLarge(
            "data",
            f"the message is {size} bytes with its attributes, "
            f"at most {MAX_MESSAGE_BYTES} fit one Pub/Sub message",
        )


async def until_closed(coro: Coroutine[Any, Any, T], closing: asyncio.Future[None]) -> T | None:
    """Await `coro`, or give it up (None) as soon as `closing` is done (the bus closed)."""
    task = asyncio.create_task(coro)
    try:
        await asyncio.wait((task, closing), return_when=asyncio.FIRST_COMPLETED)
    finally:
        # A cancelled caller or a closed bus: the work is abandoned (redis-py drops a
        # connection cancelled mid-command, so a blocked read ends at once).
        task.cancel()
    if closing.done():
        if task.done() and not task.cancelled():
            task.exception()  # read on purpose: failing because we closed is expected
        return None
    return task.result()


class BusLifecycle(ClosedOnExit):
    """What every transport shares: `async with`, a close that ends every wait, the
    refusal of calls once closed, and `subscribe` checking its arguments at the call.
    A transport calls `_begin_close()` first in `close()`, and reads in `_consume`."""

    # Whether a publish logs the batch in its topic's recovery log too (the stream is
    # that log: `RedisStreamsTransport` with `topic_log`), so nobody else appends it.
    logs_topics = False

    def __init__(self) -> None:
        self._closed = False
        self._closing: asyncio.Future[None] | None = None

    def subscribe(self, topics: Sequence[str], subscriber: str) -> AsyncGenerator[Received, None]:
        """The subscriber's messages, until the bus closes or the caller stops iterating."""
        # A plain function around the generator, so bad arguments raise at the call.
        return self._consume(validate_subscription(topics, subscriber), subscriber)

    def _consume(self, topics: tuple[str, ...], subscriber: str) -> AsyncGenerator[Received, None]:
        raise NotImplementedError

    def _begin_close(self) -> bool:
        """Mark the bus closed and wake every wait; False if it was closed already."""
        if self._closed:
            return False
        self._closed = True
        if self._closing is not None and not self._closing.done():
            self._closing.set_result(None)
        return True

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        """Refuse the call with BusUnavailable once the bus is closed."""
        if self._closed:
            raise BusUnavailable("the bus is closed")

    async def _until_closed(self, coro: Coroutine[Any, Any, T]) -> T | None:
        """Await `coro`, or give it up (None) as soon as the bus is closed."""
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_future()
            if self._closed:
                self._closing.set_result(None)
        return await until_closed(coro, self._closing)
