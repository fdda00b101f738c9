"""The subscriber side of the Pub/Sub transport: streaming pulls bridged into the loop.

The library's streaming pull (`SubscriberClient.subscribe`) calls back on its own
threads; each message crosses into the event loop through `call_soon_threadsafe`.
Flow control holds at most `max_messages` (and `max_bytes`) un-acked per subscription,
so a slow gateway stops pulling instead of buffering. A message is acked only when the
caller acks its `Received`; while it is held the library extends its lease, and once
the stream has stopped, what it did not ack comes again when that lease runs out.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Sequence
from contextlib import suppress
from typing import Any, Protocol

from router.bus.base import Received
from router.bus.pubsub_clients import PubSubClients
from router.bus.pubsub_errors import pubsub_errors

__all__ = ["PullOwner", "StreamingPull"]


class PullOwner(Protocol):
    """What a streaming pull needs of the transport that started it."""

    @property
    def closed(self) -> bool: ...

    def check_open(self) -> None: ...

    async def connect(self) -> PubSubClients: ...

    async def create_subscription(
        self, clients: PubSubClients, topic: str, subscriber: str
    ) -> str: ...


class StreamingPull:
    """One subscribe() call's streaming pulls (one per topic), bridged into the loop."""

    def __init__(
        self, owner: PullOwner, flow_control: Any, topics: Sequence[str], subscriber: str
    ) -> None:
        """`flow_control` is the library's FlowControl for each of the streams."""
        self._owner = owner
        self._flow_control = flow_control
        self._topics = topics
        self._subscriber = subscriber
        self._loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Received | BaseException] = asyncio.Queue()
        self._futures: list[Any] = []
        # ack id -> (subscription path, library message): received, not yet acked.
        self._outstanding: dict[str, tuple[str, Any]] = {}
        # Handed back when the stream stopped; a late ack still goes to Pub/Sub directly.
        self._released: dict[str, str] = {}
        self._live = False
        self._stopping: asyncio.Future[None] | None = None

    async def start(self) -> bool:
        """Open the subscriptions' streams; False when stopped (the bus closed) meanwhile."""
        from google.cloud.pubsub_v1.subscriber.scheduler import ThreadScheduler

        clients = await self._owner.connect()
        with pubsub_errors("subscribe"):
            paths = {
                topic: await self._owner.create_subscription(clients, topic, self._subscriber)
                for topic in self._topics
            }
        if self._stopping is not None or self._owner.closed:
            return False  # stopped (the bus closed) while the subscriptions were made
        self._live = True
        for topic, path in paths.items():
            # The callback only hands the message to the loop: two threads are plenty.
            executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=2, thread_name_prefix=f"pubsub-{self._subscriber}"
            )
            future = clients.streaming.subscribe(
                path,
                callback=functools.partial(self._on_message, topic, path),
                flow_control=self._flow_control,
                scheduler=ThreadScheduler(executor),
            )
            future.add_done_callback(self._on_done)
            self._futures.append(future)
        return True

    def _on_message(self, topic: str, path: str, message: Any) -> None:
        """On a library thread: pass the message to the event loop."""
        try:
            self._loop.call_soon_threadsafe(self._arrived, topic, path, message)
        except RuntimeError:  # the loop is closed: let Pub/Sub deliver it again
            message.nack()

    def _on_done(self, future: Any) -> None:
        """On a library thread: a stream that ends while live has failed."""
        if not self._live:
            return
        exc = future.exception()
        error = exc if exc is not None else RuntimeError("the stream closed")
        with suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self.queue.put_nowait, error)

    def _arrived(self, topic: str, path: str, message: Any) -> None:
        ack_id: str = message.ack_id
        if not self._live:
            return  # the stream is stopping: it comes again after its ack deadline
        self._outstanding[ack_id] = (path, message)
        self.queue.put_nowait(
            Received(
                topic=topic,
                data=bytes(message.data),
                attributes=dict(message.attributes),
                message_id=str(message.message_id),
                acker=functools.partial(self._ack, ack_id),
            )
        )

    async def _ack(self, ack_id: str) -> None:
        self._owner.check_open()
        held = self._outstanding.pop(ack_id, None)
        if held is not None and self._live:
            held[1].ack()  # the library batches acks and releases the flow control
            return
        path = held[0] if held is not None else self._released.pop(ack_id, None)
        if path is None:
            return  # acked already
        clients = await self._owner.connect()
        with pubsub_errors("ack"):
            await clients.subscriber.acknowledge(subscription=path, ack_ids=[ack_id])

    async def stop(self) -> None:
        """Stop the streams and their threads; what was not acked comes again later."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stopping)

    async def _stop(self) -> None:
        self._live = False
        futures, self._futures = self._futures, []
        for future in futures:
            future.cancel()  # starts the shutdown; the future resolves once it is done
        for future in futures:
            await self._shut_down(future)
        # What was received and not acked comes again once its ack deadline passes. It
        # is not handed back at once (a modack of 0): after the stream closed, that
        # stalls the subscription on the official emulator.
        for ack_id, (path, _) in self._outstanding.items():
            self._released[ack_id] = path
        self._outstanding.clear()
        while not self.queue.empty():
            self.queue.get_nowait()

    async def _shut_down(self, future: Any) -> None:
        """Wait until a cancelled streaming pull has stopped its threads."""
        # Not asyncio.wrap_future: a cancelled StreamingPullFuture reports cancelled()
        # even once it resolved, which wrap_future would turn into our own cancellation.
        stopped = self._loop.create_future()

        def on_done(_: Any) -> None:
            with suppress(RuntimeError):  # the loop is closed: nobody waits any more
                self._loop.call_soon_threadsafe(_resolve, stopped)

        future.add_done_callback(on_done)
        await stopped


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
