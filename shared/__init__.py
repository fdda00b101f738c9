"""Leaf package: models, settings, wire formats, the Redis key schema, errors and the proto."""

from __future__ import annotations

from shared.clock import Clock, ManualClock, SystemClock
from shared.errors import (
    AuthError,
    ConfigError,
    GatewayUnavailable,
    ImrouteError,
    InvalidInput,
    PayloadTooLarge,
    RegistryUnavailable,
)
from shared.keys import KeySchema
from shared.models import GatewayInfo, Message, Route
from shared.settings import Settings

__all__ = [
    "AuthError",
    "Clock",
    "ConfigError",
    "GatewayInfo",
    "GatewayUnavailable",
    "ImrouteError",
    "InvalidInput",
    "KeySchema",
    "ManualClock",
    "Message",
    "PayloadTooLarge",
    "RegistryUnavailable",
    "Route",
    "Settings",
    "SystemClock",
]
