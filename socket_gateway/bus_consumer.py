"""The gateway's side of the bus: broadcast and its group's batches to local sockets."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import aclosing

from google.protobuf.message import DecodeError

from router.bus.base import BROADCAST, EPOCH, SEQ, Bus, group_topic
from shared.errors import BusUnavailable, ImrouteError
from shared.proto import gateway_pb2
from shared.tracing import TRACEPARENT

__all__ = ["consume", "gateway_topics"]

log = logging.getLogger(__name__)

RETRY_S = 1.0


def gateway_topics(group_id: str) -> list[str]:
    """Every gateway hears broadcasts and its own group's multicasts."""
    return [BROADCAST, group_topic(group_id)]


Offer = Callable[[str, gateway_pb2.Batch], Awaitable[None]]


async def consume(bus: Bus, gateway_id: str, group_id: str, offer: Offer) -> None:
    """Hand every batch of the gateway's topics to `offer` (the follower, which writes
    it in log order), acking each once it was handed over.

    The ack comes after the write, so a gateway that dies in between gets the batch
    again on restart; its recent-batch-id set (or the clients' own) absorbs repeats.
    """
    topics = gateway_topics(group_id)
    while True:
        try:
            # aclosing: a failed subscription stops its streams now, not at GC.
            async with aclosing(bus.subscribe(topics, gateway_id)) as messages:
                async for received in messages:
                    try:
                        batch = gateway_pb2.Batch.FromString(received.data)
                    except DecodeError:
                        # Redelivering a message nobody can read would only repeat this.
                        log.error(
                            "dropping an undecodable batch %s on %s",
                            received.message_id,
                            received.topic,
                        )
                    else:
                        attributes = received.attributes
                        if not batch.traceparent:  # the publish's span, when traced
                            batch.traceparent = attributes.get(TRACEPARENT, "")
                        if not batch.seq and SEQ in attributes:
                            # Given where the stream is the topic's log: the entry's place.
                            batch.seq = int(attributes[SEQ])
                            batch.epoch = int(attributes.get(EPOCH, "0"))
                        try:
                            # Written now, or once its turn comes; its content read
                            # first when it was stored once for the push.
                            await offer(received.topic, batch)
                        except ImrouteError as exc:
                            # Redis did not give the content: not acked, so the
                            # subscription starts over and the batch comes again.
                            raise BusUnavailable(
                                f"batch {batch.batch_id} not handed over: {exc}"
                            ) from exc
                    await received.ack()
            return
        except BusUnavailable as exc:
            log.warning("bus subscription failed, retrying in %.0fs: %s", RETRY_S, exc)
            await asyncio.sleep(RETRY_S)
