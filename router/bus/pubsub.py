"""The Google Cloud Pub/Sub bus: one Pub/Sub topic per imroute topic, one subscription
per gateway per topic.

- Publishing goes through `google.pubsub_v1.PublisherAsyncClient.publish` (grpc.aio),
  one Pub/Sub message per batch: imroute's own batcher has already grouped the uids,
  so the library's publish batching would only add latency. A topic missing at publish
  time is created, and the publish repeated.
- Subscribing uses the library's streaming pull (`SubscriberClient.subscribe`), with
  flow control: at most `max_outstanding` messages (and `max_outstanding_bytes`) per
  subscription are held un-acked, so a slow gateway stops pulling instead of buffering.
  The library calls back on its own threads; the messages cross into the event loop.
- A message is acked only when the caller acks its `Received`, after local delivery.
  While a message is held, the library extends its lease, 10 s at a time; once its
  subscriber has stopped (or crashed), a message it received and did not ack comes
  again when that lease runs out.
- Topics and subscriptions are created when missing (`pubsub_names` maps the names).
  Subscriptions keep unacked messages for `retention_s` and expire after
  `subscription_ttl_s` without a subscriber, so departed gateways leave nothing behind.

With `PUBSUB_EMULATOR_HOST` set, the library talks to that emulator without
credentials; otherwise it uses Application Default Credentials.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import os
import random
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Self

import grpc.aio
from google.api_core import exceptions as gexc
from google.api_core.retry import AsyncRetry, if_exception_type
from google.protobuf import duration_pb2
from google.pubsub_v1 import (
    ExpirationPolicy,
    PublisherAsyncClient,
    PubsubMessage,
    SubscriberAsyncClient,
    Subscription,
)

from router.bus.base import (
    BusLifecycle,
    BusUnavailable,
    Received,
    validate_message,
    validate_subscription,
    validate_topic,
)
from router.bus.pubsub_names import subscription_id, telemetry_header, topic_id
from router.hedging import (
    AttemptContext,
    HedgeObserver,
    Hedger,
    HedgingSettings,
    RetrySettings,
)
from shared.clock import AsyncClock, SystemClock
from shared.errors import ConfigError

__all__ = ["TELEMETRY_HEADER", "PubSubBus", "PubSubClients"]

TELEMETRY_HEADER = "x-goog-pubsub-client-telemetry"

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.1
BACKOFF_MAX_S = 5.0
# The codes Google's clients retry a Publish on.
_RETRYABLE_CODES = if_exception_type(
    gexc.Cancelled,
    gexc.ServiceUnavailable,
    gexc.DeadlineExceeded,
    gexc.InternalServerError,
    gexc.Aborted,
    gexc.ResourceExhausted,
    gexc.Unknown,
)


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, Exception) and _RETRYABLE_CODES(exc)


@dataclass(slots=True)
class PubSubClients:
    """The three clients the transport uses; built for the running event loop."""

    publisher: PublisherAsyncClient
    subscriber: SubscriberAsyncClient
    streaming: Any  # google.cloud.pubsub_v1.SubscriberClient: streaming pull, on threads

    @classmethod
    def connect(cls, endpoint: str | None = None) -> PubSubClients:
        """Clients for `endpoint` (else PUBSUB_EMULATOR_HOST) over plaintext gRPC without
        credentials, as for the emulator; with neither, Google with default credentials."""
        import google.auth.exceptions
        from google.cloud.pubsub_v1 import SubscriberClient

        endpoint = endpoint or os.environ.get("PUBSUB_EMULATOR_HOST") or None
        if endpoint is not None:
            return cls._plaintext(endpoint)
        try:
            streaming = SubscriberClient()
            return cls(PublisherAsyncClient(), SubscriberAsyncClient(), streaming)
        except google.auth.exceptions.DefaultCredentialsError:
            raise ConfigError(
                "IMROUTE_BUS_URL: pubsub:// found no Google credentials: set "
                "GOOGLE_APPLICATION_CREDENTIALS, or PUBSUB_EMULATOR_HOST for the emulator"
            ) from None

    @classmethod
    def _plaintext(cls, endpoint: str) -> PubSubClients:
        # Channels of our own: the library's emulator channels keep gRPC's 4 MiB receive
        # limit, so a streaming pull could never deliver a message near Pub/Sub's 10 MB.
        import grpc
        from google.cloud.pubsub_v1 import SubscriberClient
        from google.pubsub_v1.services.publisher.transports import (
            PublisherGrpcAsyncIOTransport,
        )
        from google.pubsub_v1.services.subscriber.transports import (
            SubscriberGrpcAsyncIOTransport,
            SubscriberGrpcTransport,
        )

        unlimited = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        return cls(
            PublisherAsyncClient(
                transport=PublisherGrpcAsyncIOTransport(
                    channel=grpc.aio.insecure_channel(endpoint, options=unlimited)
                )
            ),
            SubscriberAsyncClient(
                transport=SubscriberGrpcAsyncIOTransport(
                    channel=grpc.aio.insecure_channel(endpoint, options=unlimited)
                )
            ),
            SubscriberClient(
                transport=SubscriberGrpcTransport(
                    channel=grpc.insecure_channel(endpoint, options=unlimited)
                )
            ),
        )

    async def close(self) -> None:
        """Close all three, even when one of them fails to."""
        closes: tuple[Callable[[], Awaitable[Any]], ...] = (
            self.publisher.transport.close,
            self.subscriber.transport.close,
            lambda: asyncio.to_thread(self.streaming.close),
        )
        for close in closes:
            try:
                await close()
            except Exception as exc:  # the others must still close
                log.warning("closing a Pub/Sub client failed: %r", exc)


class PubSubBus(BusLifecycle):
    """A Bus over Google Cloud Pub/Sub."""

    def __init__(
        self,
        project: str,
        prefix: str = "imroute:",
        *,
        max_outstanding: int = 100,
        max_outstanding_bytes: int = 64 << 20,
        ack_deadline_s: int = 10,
        retention_s: int = 3600,
        subscription_ttl_s: int = 86_400,
        endpoint: str | None = None,
        clients: PubSubClients | None = None,
        hedging: HedgingSettings | None = None,
        retry: RetrySettings | None = None,
        observer: HedgeObserver | None = None,
        clock: AsyncClock | None = None,
        message_ordering: bool = False,
    ) -> None:
        """`endpoint` (host:port) talks plaintext gRPC without credentials, as to the
        emulator or a test server; `clients` replaces the clients altogether.
        `hedging` hedges every publish (off by default); `retry` governs retries of the
        original attempt; `message_ordering` (ordering keys) cannot go with hedging."""
        self._project = project
        self._prefix = prefix
        self._max_outstanding = max_outstanding
        self._max_outstanding_bytes = max_outstanding_bytes
        self._ack_deadline_s = ack_deadline_s
        self._retention_s = retention_s
        self._subscription_ttl_s = subscription_ttl_s
        self._hedger = Hedger(
            hedging,
            retry or RetrySettings(),
            clock or SystemClock(),
            _retryable,
            message_ordering=message_ordering,
            observer=observer,
        )
        self._admin_retry = AsyncRetry(
            predicate=_RETRYABLE_CODES, initial=0.1, maximum=1.0, multiplier=2.0, timeout=10.0
        )
        self._endpoint = endpoint
        self._clients = clients
        self._connecting = asyncio.Lock()
        self._streams: set[_Stream] = set()
        super().__init__()

    async def __aenter__(self) -> Self:
        """Build the clients now, so missing credentials stop a service at start-up."""
        await self._connect()
        return self

    # --- the Bus protocol -----------------------------------------------------------

    async def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None
    ) -> str:
        """Publish one message to the topic; returns its Pub/Sub message id."""
        validate_topic(topic)
        validate_message(data, attributes)
        path = PublisherAsyncClient.topic_path(self._project, topic_id(self._prefix, topic))
        message = PubsubMessage(data=data, attributes=dict(attributes or {}))
        clients = await self._connect()
        with _translated("publish"):
            return await self._hedger.run(
                topic, functools.partial(self._publish_attempt, clients, path, message)
            )

    async def _publish_attempt(
        self, clients: PubSubClients, path: str, message: PubsubMessage, ctx: AttemptContext
    ) -> str:
        """One attempt, original or hedge: one Publish RPC, never retried by the library
        (the Hedger retries the original), with the telemetry Google's clients send."""
        self._check_open()  # a retry or hedge due after close() must not use its channel
        metadata = [(TELEMETRY_HEADER, telemetry_header(ctx))]
        try:
            reply = await clients.publisher.publish(
                topic=path, messages=[message], retry=None, timeout=ctx.timeout_s,
                metadata=metadata,
            )  # fmt: skip
        except gexc.NotFound:
            # Nobody prepared this topic yet: create it so publishing works, though
            # (as with every transport) no subscriber gets what came before it.
            await self._create_topic(clients, path)
            reply = await clients.publisher.publish(
                topic=path, messages=[message], retry=None, timeout=ctx.timeout_s,
                metadata=metadata,
            )  # fmt: skip
        return str(reply.message_ids[0])

    async def prepare(self, topics: Sequence[str], subscriber: str) -> None:
        """Create the topics and the subscriber's subscriptions to them, if missing."""
        checked = validate_subscription(topics, subscriber)
        clients = await self._connect()
        with _translated("prepare"):
            for topic in checked:
                await self._create_subscription(clients, topic, subscriber)

    def subscribe(self, topics: Sequence[str], subscriber: str) -> AsyncGenerator[Received, None]:
        """The subscriber's messages, until the bus closes or the caller stops iterating."""
        checked = validate_subscription(topics, subscriber)
        return self._consume(checked, subscriber)

    async def close(self) -> None:
        """End every subscription, handing back what they had not acked; close the clients."""
        if not self._begin_close():
            return
        for stream in list(self._streams):
            await stream.stop()
        if self._clients is not None:
            await self._clients.close()

    # --- internals ------------------------------------------------------------------

    async def _connect(self) -> PubSubClients:
        self._check_open()
        async with self._connecting:
            if self._clients is None:
                self._clients = PubSubClients.connect(self._endpoint)
            return self._clients

    async def _create_topic(self, clients: PubSubClients, path: str) -> None:
        with suppress(gexc.AlreadyExists):
            await clients.publisher.create_topic(name=path, retry=self._admin_retry)

    def _subscription_path(self, topic: str, subscriber: str) -> str:
        return SubscriberAsyncClient.subscription_path(
            self._project, subscription_id(self._prefix, topic, subscriber)
        )

    async def _create_subscription(
        self, clients: PubSubClients, topic: str, subscriber: str
    ) -> str:
        topic_path = PublisherAsyncClient.topic_path(self._project, topic_id(self._prefix, topic))
        path = self._subscription_path(topic, subscriber)
        await self._create_topic(clients, topic_path)
        request = Subscription(
            name=path,
            topic=topic_path,
            ack_deadline_seconds=self._ack_deadline_s,
            message_retention_duration=duration_pb2.Duration(seconds=self._retention_s),
            expiration_policy=ExpirationPolicy(
                ttl=duration_pb2.Duration(seconds=self._subscription_ttl_s)
            ),
        )
        # An existing one keeps its place: what it holds unacked is still owed.
        with suppress(gexc.AlreadyExists):
            await clients.subscriber.create_subscription(request=request, retry=self._admin_retry)
        return path

    async def _consume(
        self, topics: tuple[str, ...], subscriber: str
    ) -> AsyncGenerator[Received, None]:
        backoff = delay = BACKOFF_MIN_S
        while not self._closed:
            stream = _Stream(self, topics, subscriber)
            self._streams.add(stream)
            try:
                if not await self._until_closed(stream.start()):
                    return  # the bus closed meanwhile
                while True:
                    item = await self._until_closed(stream.queue.get())
                    if item is None:
                        return
                    if isinstance(item, BaseException):
                        raise BusUnavailable(f"the streaming pull ended: {item}") from item
                    backoff = BACKOFF_MIN_S
                    yield item
            except BusUnavailable as exc:
                if self._closed:
                    return
                delay = backoff * random.uniform(0.5, 1.0)
                log.warning("bus subscriber %s: %s; retrying in %.2fs", subscriber, exc, delay)
            finally:
                await stream.stop()
                self._streams.discard(stream)
            await self._until_closed(asyncio.sleep(delay))
            backoff = min(backoff * 2, BACKOFF_MAX_S)


class _Stream:
    """One subscribe() call's streaming pulls (one per topic), bridged into the loop."""

    def __init__(self, bus: PubSubBus, topics: Sequence[str], subscriber: str) -> None:
        self._bus = bus
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
        from google.cloud.pubsub_v1.subscriber.scheduler import ThreadScheduler
        from google.cloud.pubsub_v1.types import FlowControl

        clients = await self._bus._connect()
        flow = FlowControl(
            max_messages=self._bus._max_outstanding,
            max_bytes=self._bus._max_outstanding_bytes,
            # Leases of 10 s (Pub/Sub's minimum) instead of the library's 60: held
            # messages are extended all the same, and a crashed gateway's messages
            # come again after 10 s.
            max_duration_per_lease_extension=self._bus._ack_deadline_s,
        )
        with _translated("subscribe"):
            paths = {
                topic: await self._bus._create_subscription(clients, topic, self._subscriber)
                for topic in self._topics
            }
        if self._stopping is not None or self._bus._closed:
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
                flow_control=flow,
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
        self._bus._check_open()
        held = self._outstanding.pop(ack_id, None)
        if held is not None and self._live:
            held[1].ack()  # the library batches acks and releases the flow control
            return
        path = held[0] if held is not None else self._released.pop(ack_id, None)
        if path is None:
            return  # acked already
        clients = await self._bus._connect()
        with _translated("ack"):
            await clients.subscriber.acknowledge(subscription=path, ack_ids=[ack_id])

    async def stop(self) -> None:
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


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """Map google-api-core errors into BusUnavailable, naming the operation."""
    try:
        yield
    except gexc.RetryError as exc:
        raise BusUnavailable(f"pubsub {what}: gave up retrying: {exc.cause}") from exc
    except grpc.aio.UsageError as exc:  # e.g. a call on a channel close() closed
        raise BusUnavailable(f"pubsub {what}: {exc}") from exc
    except gexc.GoogleAPICallError as exc:
        raise BusUnavailable(f"pubsub {what}: {exc.code} {exc.message}") from exc
