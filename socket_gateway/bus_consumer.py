"""The gateway's side of the bus: broadcast and its group's batches to local sockets."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import aclosing

from google.protobuf.message import DecodeError

from router.bus.base import BROADCAST, EPOCH, SEQ, Bus, Received, group_topic
from shared.errors import BusUnavailable, ImrouteError
from shared.proto import gateway_pb2
from shared.throttled import ThrottledLine
from shared.tracing import TRACEPARENT

__all__ = ["UNREADABLE", "consume", "gateway_topics"]

log = logging.getLogger(__name__)

RETRY_S = 1.0

# Bus entries no gateway can read, dropped (acked), process-wide: counted, and logged.
UNREADABLE = ThrottledLine(
    log,
    "dropped %(n)d unreadable batch(es) since the last line, the last %(entry)s on "
    "%(topic)s: %(why)s (%(total)d in all)",
    level=logging.ERROR,
)


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
                    batch = _read(received)
                    if batch is not None:
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


def _read(received: Received) -> gateway_pb2.Batch | None:
    """The batch `received` carries, its place in the topic's log from the entry's
    attributes where the stream is the log; None (logged) for one nobody can read,
    which is acked: redelivering it would only repeat this, and hold back every batch
    behind it."""
    try:
        batch = gateway_pb2.Batch.FromString(received.data)
        attributes = received.attributes
        if not batch.traceparent:  # the publish's span, when traced
            batch.traceparent = attributes.get(TRACEPARENT, "")
        if not batch.seq and SEQ in attributes:
            # Given where the stream is the topic's log: the entry's place.
            batch.seq = _counter(attributes[SEQ], 1)
            batch.epoch = _counter(attributes.get(EPOCH, "0"), 0)
    except (DecodeError, ValueError) as exc:
        UNREADABLE.note(
            entry=received.message_id,
            topic=received.topic,
            why="not a batch" if isinstance(exc, DecodeError) else f"bad attributes ({exc})",
        )
        return None
    return batch


def _counter(text: str, least: int) -> int:
    value = int(text)
    if not least <= value < 1 << 63:
        raise ValueError(f"{value} is out of range")
    return value
