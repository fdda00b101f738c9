"""Choosing the bus transport from IMROUTE_BUS_URL."""

from __future__ import annotations

from router.bus.base import Bus
from router.bus.redis_streams import RedisStreamsBus
from shared.errors import ConfigError

__all__ = ["REDIS_SCHEMES", "open_bus"]

REDIS_SCHEMES = ("redis", "rediss", "unix")


def open_bus(url: str, prefix: str) -> Bus:
    """The bus `url` names: Redis Streams for redis://, rediss:// and unix://."""
    # Only the scheme is ever echoed back: the rest of the URL may hold a password.
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower() if sep else ""
    if scheme in REDIS_SCHEMES:
        return RedisStreamsBus(url, prefix)
    if scheme == "pubsub":
        # The Pub/Sub transport will be imported here, lazily: google-cloud-pubsub is
        # heavy, and only processes configured for it should pay for the import.
        raise ConfigError("IMROUTE_BUS_URL: the Pub/Sub transport is not available yet")
    accepted = ", ".join(f"{s}://" for s in REDIS_SCHEMES)
    found = f"scheme {scheme!r}" if scheme else "a value without a scheme"
    raise ConfigError(f"IMROUTE_BUS_URL: {found} is not supported; use {accepted}")
