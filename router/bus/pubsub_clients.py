"""The Pub/Sub transport's three clients, and the channels they use with an emulator.

With `PUBSUB_EMULATOR_HOST` (or an explicit endpoint) set, the clients talk plaintext
gRPC to it without credentials; otherwise they use Application Default Credentials.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from google.pubsub_v1 import PublisherAsyncClient, SubscriberAsyncClient

from shared.errors import ConfigError

__all__ = ["PubSubClients", "check_credentials"]

NO_CREDENTIALS = (
    "IMROUTE_BUS_URL: pubsub:// found no Google credentials: set "
    "GOOGLE_APPLICATION_CREDENTIALS, or PUBSUB_EMULATOR_HOST for the emulator"
)


def check_credentials() -> None:
    """ConfigError unless the clients will have something to connect with: the emulator
    (PUBSUB_EMULATOR_HOST), or Google's Application Default Credentials. Before the
    process starts serving, so that it stops with the message, not a traceback."""
    if os.environ.get("PUBSUB_EMULATOR_HOST"):
        return
    import google.auth
    import google.auth.exceptions

    try:
        google.auth.default()
    except google.auth.exceptions.DefaultCredentialsError:
        raise ConfigError(NO_CREDENTIALS) from None


log = logging.getLogger(__name__)


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
            raise ConfigError(NO_CREDENTIALS) from None

    @classmethod
    def _plaintext(cls, endpoint: str) -> PubSubClients:
        # Channels of our own: the library's emulator channels keep gRPC's 4 MiB receive
        # limit, so a streaming pull could never deliver a message near Pub/Sub's 10 MB.
        import grpc.aio
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
