"""The Google Cloud Pub/Sub bus: one Pub/Sub topic per imroute topic, one subscription
per gateway per topic.

- Publishing goes through `google.pubsub_v1.PublisherAsyncClient.publish` (grpc.aio),
  one Pub/Sub message per batch: imroute's own batcher has already grouped the uids,
  so the library's publish batching would only add latency. A topic missing at publish
  time is created, and the publish repeated. Each attempt is one Publish RPC; retries
  and hedges are the wrapper's (`PubSubBus` is `HedgedBus` around `PubSubTransport`).
- Subscribing is streaming pull with flow control (`pubsub_stream`); a message is
  acked only when the caller acks its `Received`, after local delivery.
- Topics and subscriptions are created when missing (`pubsub_names` maps the names).
  Subscriptions keep unacked messages for `retention_s` and expire after
  `subscription_ttl_s` without a subscriber, so departed gateways leave nothing behind.

The clients and their channels are `pubsub_clients`; google-api-core's errors map into
ours in `pubsub_errors`.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import suppress
from typing import Any, Self, Unpack

from google.api_core import exceptions as gexc
from google.api_core.retry import AsyncRetry
from google.protobuf import duration_pb2, timestamp_pb2
from google.pubsub_v1 import (
    ExpirationPolicy,
    PublisherAsyncClient,
    PubsubClientTelemetry,
    PubsubMessage,
    SubscriberAsyncClient,
    Subscription,
)

from router.bus.base import BusLifecycle, BusUnavailable, Received, validate_subscription
from router.bus.hedged import HedgedBus, Publishing, split_publishing
from router.bus.losses import BusLosses
from router.bus.pubsub_clients import PubSubClients
from router.bus.pubsub_errors import RETRYABLE_CODES, is_retryable_code, pubsub_errors
from router.bus.pubsub_names import subscription_id, topic_id
from router.bus.pubsub_stream import StreamingPull
from router.hedging import Attempt, AttemptContext
from shared.backoff import backoff_s

__all__ = [
    "TELEMETRY_HEADER",
    "PubSubBus",
    "PubSubBusOptions",
    "PubSubClients",
    "PubSubTransport",
    "telemetry_header",
]

TELEMETRY_HEADER = "x-goog-pubsub-client-telemetry"

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.1
BACKOFF_MAX_S = 5.0


class PubSubBusOptions(Publishing, total=False):
    """PubSubBus's keyword arguments: Publishing's, then PubSubTransport's."""

    max_outstanding: int
    max_outstanding_bytes: int
    ack_deadline_s: int
    retention_s: int
    subscription_ttl_s: int
    endpoint: str | None
    clients: PubSubClients | None
    message_ordering: bool


class PubSubTransport(BusLifecycle):
    """The Google Cloud Pub/Sub transport."""

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
        message_ordering: bool = False,
    ) -> None:
        """`endpoint` (host:port) talks plaintext gRPC without credentials, as to the
        emulator or a test server; `clients` replaces the clients altogether.
        `message_ordering` (ordering keys) cannot go with hedging."""
        self._project = project
        self._prefix = prefix
        self._max_outstanding = max_outstanding
        self._max_outstanding_bytes = max_outstanding_bytes
        self._ack_deadline_s = ack_deadline_s
        self._retention_s = retention_s
        self._subscription_ttl_s = subscription_ttl_s
        self.message_ordering = message_ordering
        self._admin_retry = AsyncRetry(
            predicate=RETRYABLE_CODES, initial=0.1, maximum=1.0, multiplier=2.0, timeout=10.0
        )
        self._endpoint = endpoint
        self._clients = clients
        self._connecting = asyncio.Lock()
        self._streams: set[StreamingPull] = set()
        # Pub/Sub drops what outlived its retention without telling the publisher: this
        # stays empty, and the gateways' sequencers count such batches (docs/operations/bus.md).
        self.losses = BusLosses()
        super().__init__()

    async def __aenter__(self) -> Self:
        """Build the clients now, so missing credentials stop a service at start-up."""
        await self.connect()
        return self

    # --- publishing: what the wrapper hedges ------------------------------------------

    async def attempt(self, topic: str, data: bytes, attributes: Mapping[str, str]) -> Attempt[str]:
        """One Publish RPC of the message; it returns the Pub/Sub message id."""
        path = PublisherAsyncClient.topic_path(self._project, topic_id(self._prefix, topic))
        message = PubsubMessage(data=data, attributes=dict(attributes))
        clients = await self.connect()

        async def publish(ctx: AttemptContext) -> str:
            # Never retried by the library (the wrapper retries the original), and with
            # the telemetry Google's clients send.
            self.check_open()  # a retry or hedge due after close() must not use its channel
            metadata = [(TELEMETRY_HEADER, telemetry_header(ctx))]
            try:
                reply = await clients.publisher.publish(
                    topic=path, messages=[message], retry=None, timeout=ctx.timeout_s,
                    metadata=metadata,
                )  # fmt: skip
            except gexc.NotFound:
                # Nobody prepared this topic yet: create it so publishing works, though
                # (as with every transport) no subscriber gets what came before it.
                await self._create_topic(clients, path, ctx.timeout_s)
                reply = await clients.publisher.publish(
                    topic=path, messages=[message], retry=None, timeout=ctx.timeout_s,
                    metadata=metadata,
                )  # fmt: skip
            return str(reply.message_ids[0])

        return publish

    # Retried: the codes Google's clients retry a Publish on; errors: google-api-core's.
    is_retryable = staticmethod(is_retryable_code)
    errors = staticmethod(pubsub_errors)

    # --- subscribing ------------------------------------------------------------------

    async def prepare(self, topics: Sequence[str], subscriber: str) -> None:
        """Create the topics and the subscriber's subscriptions to them, if missing."""
        checked = validate_subscription(topics, subscriber)
        clients = await self.connect()
        with pubsub_errors("prepare"):
            for topic in checked:
                await self.create_subscription(clients, topic, subscriber)

    async def leave(self, topics: Sequence[str], subscriber: str) -> None:
        """Nothing to do: Pub/Sub counts no losses, and deletes a subscription a day after
        its last subscriber (a restart under the same id within it picks it up again)."""
        validate_subscription(topics, subscriber)

    async def close(self) -> None:
        """End every subscription, handing back what they had not acked; close the clients."""
        if not self._begin_close():
            return
        for stream in list(self._streams):
            await stream.stop()
        if self._clients is not None:
            await self._clients.close()

    # --- what the streaming pulls use -------------------------------------------------

    async def connect(self) -> PubSubClients:
        """The clients, built on first use; BusUnavailable once the bus is closed."""
        self.check_open()
        async with self._connecting:
            if self._clients is None:
                self._clients = PubSubClients.connect(self._endpoint)
            return self._clients

    async def create_subscription(self, clients: PubSubClients, topic: str, subscriber: str) -> str:
        """Create the topic and the subscriber's subscription to it, if missing."""
        topic_path = PublisherAsyncClient.topic_path(self._project, topic_id(self._prefix, topic))
        path = SubscriberAsyncClient.subscription_path(
            self._project, subscription_id(self._prefix, topic, subscriber)
        )
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

    # --- internals --------------------------------------------------------------------

    async def _create_topic(
        self, clients: PubSubClients, path: str, timeout_s: float | None = None
    ) -> None:
        """The topic, unless it exists: with the admin calls' retry, or, within a publish
        attempt (`timeout_s`, the attempt's), once: the attempt is what is retried."""
        options: dict[str, Any] = (
            {"retry": self._admin_retry}
            if timeout_s is None
            else {"retry": None, "timeout": timeout_s}
        )
        with suppress(gexc.AlreadyExists):
            await clients.publisher.create_topic(name=path, **options)

    def _flow_control(self) -> Any:
        from google.cloud.pubsub_v1.types import FlowControl

        return FlowControl(
            max_messages=self._max_outstanding,
            max_bytes=self._max_outstanding_bytes,
            # Leases of 10 s (Pub/Sub's minimum) instead of the library's 60: held
            # messages are extended all the same, and a crashed gateway's messages
            # come again after 10 s.
            max_duration_per_lease_extension=self._ack_deadline_s,
        )

    async def _consume(
        self, topics: tuple[str, ...], subscriber: str
    ) -> AsyncGenerator[Received, None]:
        failures, delay = 0, BACKOFF_MIN_S
        while not self._closed:
            stream = StreamingPull(self, self._flow_control(), topics, subscriber)
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
                    failures = 0
                    yield item
            except BusUnavailable as exc:
                if self._closed:
                    return
                failures += 1
                delay = backoff_s(failures, BACKOFF_MIN_S, BACKOFF_MAX_S)
                log.warning("bus subscriber %s: %s; retrying in %.2fs", subscriber, exc, delay)
            finally:
                await stream.stop()
                self._streams.discard(stream)
            await self._until_closed(asyncio.sleep(delay))


def telemetry_header(ctx: AttemptContext) -> str:
    """The `x-goog-pubsub-client-telemetry` value of one attempt, as Google's clients send
    it: a base64 (standard alphabet) PubsubClientTelemetry whose publish operation has
    the hedged attempt count (0 for the original) and the publish's start time."""
    start = timestamp_pb2.Timestamp()
    start.FromMilliseconds(ctx.start_wall_ms)
    telemetry = PubsubClientTelemetry(
        publish_operation=PubsubClientTelemetry.PublishOperation(
            hedged_attempt_count=ctx.hedge, publish_start_time=start
        )
    )
    return base64.b64encode(PubsubClientTelemetry.serialize(telemetry)).decode()


class PubSubBus(HedgedBus[PubSubTransport]):
    """Pub/Sub behind the hedging wrapper: what open_bus gives for pubsub:// URLs."""

    def __init__(
        self, project: str, prefix: str = "imroute:", **options: Unpack[PubSubBusOptions]
    ) -> None:
        publishing, transport = split_publishing(options)
        super().__init__(PubSubTransport(project, prefix, **transport), **publishing)
