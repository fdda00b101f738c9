"""The in-process bus (`memory://`): for unit tests and examples, no server needed.

It keeps the Bus contract (router.bus.base) within one bus object: a subscriber gets
every message published to its topics after it first subscribed (`prepare` or the
first read of `subscribe`), each once; a message stays owed until it is acked, and a
subscriber that subscribes again on the same bus object gets its unacked messages
first; `close` ends every subscription and refuses calls from then on.

What it does not do:
- persist anything: a message lives in this process's memory, and is gone with the bus
  object (a restarted subscriber on a new MemoryBus gets nothing it had not acked);
- reach another process, or another bus object in this one: publishers and
  subscribers must share the object (each `open_bus("memory://")` is a bus of its own);
- redeliver on an ack deadline: an unacked message comes again only on a new subscribe;
- cap a topic: nothing is trimmed, so a subscriber that never reads holds everything.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections import deque
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Unpack

from router.bus.base import BusLifecycle, Received, validate_subscription
from router.bus.hedged import HedgedBus, Publishing
from router.bus.losses import BusLosses
from router.hedging import Attempt, AttemptContext

__all__ = ["MemoryBus", "MemoryTransport"]


@dataclass(slots=True)
class _Subscription:
    """One subscriber's place on one topic: what it is owed, and what it holds unacked."""

    subscriber: str
    # (publish sequence number, message): the number orders a subscriber's topics.
    backlog: deque[tuple[int, Received]] = field(default_factory=deque)
    unacked: dict[str, tuple[int, Received]] = field(default_factory=dict)


class MemoryTransport(BusLifecycle):
    """The in-process transport: per (topic, subscriber) a backlog and its unacked messages."""

    message_ordering = False

    def __init__(self) -> None:
        self._subscriptions: dict[tuple[str, str], _Subscription] = {}
        self._by_topic: dict[str, list[_Subscription]] = {}
        # Set when a subscriber's backlog grows; its readers clear it before they wait.
        self._wakeups: dict[str, asyncio.Event] = {}
        self._seq = itertools.count(1)
        self.losses = BusLosses()  # nothing is ever trimmed: stays empty
        super().__init__()

    async def attempt(self, topic: str, data: bytes, attributes: Mapping[str, str]) -> Attempt[str]:
        """An append to every subscription of the topic; it returns the message id."""
        self.check_open()
        attributes = dict(attributes)

        async def append(ctx: AttemptContext) -> str:
            self.check_open()
            seq = next(self._seq)
            message_id = f"m-{seq}"
            for sub in self._by_topic.get(topic, ()):
                acker = functools.partial(self._ack, sub, message_id)
                received = Received(topic, data, dict(attributes), message_id, acker)
                sub.backlog.append((seq, received))
                self._wakeup(sub.subscriber).set()
            return message_id

        return append

    def is_retryable(self, exc: BaseException) -> bool:
        """Nothing fails here that another try would mend."""
        return False

    def errors(self, operation: str) -> AbstractContextManager[None]:
        """No library errors to map: what is raised is ours already."""
        return nullcontext()

    async def prepare(self, topics: Sequence[str], subscriber: str) -> None:
        """Create the subscriber's subscriptions now: it gets what is published from here on."""
        checked = validate_subscription(topics, subscriber)
        self.check_open()
        self._subscribe(checked, subscriber)

    async def leave(self, topics: Sequence[str], subscriber: str) -> None:
        """Drop the subscriber's subscriptions, and what they held."""
        for topic in validate_subscription(topics, subscriber):
            sub = self._subscriptions.pop((topic, subscriber), None)
            if sub is not None:
                self._by_topic[topic].remove(sub)

    async def close(self) -> None:
        """End every subscription; what was not acked is dropped with the bus."""
        self._begin_close()

    def _subscribe(self, topics: Sequence[str], subscriber: str) -> list[_Subscription]:
        subs: list[_Subscription] = []
        for topic in topics:
            sub = self._subscriptions.get((topic, subscriber))
            if sub is None:
                sub = self._subscriptions[topic, subscriber] = _Subscription(subscriber)
                self._by_topic.setdefault(topic, []).append(sub)
            subs.append(sub)
        return subs

    def _wakeup(self, subscriber: str) -> asyncio.Event:
        event = self._wakeups.get(subscriber)
        if event is None:
            event = self._wakeups[subscriber] = asyncio.Event()
        return event

    async def _consume(
        self, topics: tuple[str, ...], subscriber: str
    ) -> AsyncGenerator[Received, None]:
        if self._closed:
            return
        subs = self._subscribe(topics, subscriber)
        for sub in subs:
            # Subscribing again: what was handed out and never acked is owed first.
            again = sorted(sub.unacked.values(), key=lambda held: held[0])
            sub.unacked.clear()
            sub.backlog.extendleft(reversed(again))
        wakeup = self._wakeup(subscriber)
        while not self._closed:
            ready = [sub for sub in subs if sub.backlog]
            if not ready:
                wakeup.clear()
                await self._until_closed(wakeup.wait())
                continue
            # The oldest first across the topics (the contract does not promise it).
            sub = min(ready, key=lambda s: s.backlog[0][0])
            held = sub.backlog.popleft()
            sub.unacked[held[1].message_id] = held
            yield held[1]

    async def _ack(self, sub: _Subscription, message_id: str) -> None:
        self.check_open()
        sub.unacked.pop(message_id, None)


class MemoryBus(HedgedBus[MemoryTransport]):
    """The in-process transport behind the hedging wrapper: what open_bus gives for memory://."""

    def __init__(self, **publishing: Unpack[Publishing]) -> None:
        super().__init__(MemoryTransport(), **publishing)
