"""The message bus broadcast and multicast batches travel on, and its transports.

`base` states the Bus contract; `hedged.HedgedBus` is the Bus every process uses: it
wraps one transport (`transport.BusTransport`: `redis_streams`, `pubsub`, `memory`) and
applies retries and hedging once, for all of them; `factory` picks one by URL scheme.
"""

from __future__ import annotations

from router.bus.base import (
    BROADCAST,
    GROUP_PREFIX,
    Bus,
    BusUnavailable,
    Received,
    group_topic,
    validate_subscription,
    validate_topic,
)
from router.bus.factory import open_bus
from router.bus.hedged import HedgedBus
from router.bus.memory import MemoryBus, MemoryTransport
from router.bus.redis_streams import RedisStreamsBus, RedisStreamsTransport
from router.bus.transport import BusTransport

__all__ = [
    "BROADCAST",
    "GROUP_PREFIX",
    "Bus",
    "BusTransport",
    "BusUnavailable",
    "HedgedBus",
    "MemoryBus",
    "MemoryTransport",
    "Received",
    "RedisStreamsBus",
    "RedisStreamsTransport",
    "group_topic",
    "open_bus",
    "validate_subscription",
    "validate_topic",
]
