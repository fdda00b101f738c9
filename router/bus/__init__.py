"""The message bus broadcast and multicast batches travel on, and its transports."""

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
from router.bus.redis_streams import RedisStreamsBus

__all__ = [
    "BROADCAST",
    "GROUP_PREFIX",
    "Bus",
    "BusUnavailable",
    "Received",
    "RedisStreamsBus",
    "group_topic",
    "open_bus",
    "validate_subscription",
    "validate_topic",
]
