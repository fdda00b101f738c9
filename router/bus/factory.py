"""Choosing the bus transport from IMROUTE_BUS_URL."""

from __future__ import annotations

from router.bus.base import Bus
from router.bus.redis_streams import DEFAULT_MAXLEN, RedisStreamsBus
from shared.errors import ConfigError
from shared.settings import Settings

__all__ = ["DEFAULT_MAX_OUTSTANDING", "REDIS_SCHEMES", "bus_from_settings", "open_bus"]

REDIS_SCHEMES = ("redis", "rediss", "unix")
DEFAULT_MAX_OUTSTANDING = 100


def open_bus(
    url: str,
    prefix: str,
    *,
    maxlen: int = DEFAULT_MAXLEN,
    max_outstanding: int = DEFAULT_MAX_OUTSTANDING,
) -> Bus:
    """The bus `url` names: Redis Streams for redis://, rediss:// and unix://, capped at
    `maxlen` entries per topic; Google Cloud Pub/Sub for pubsub://PROJECT, holding at
    most `max_outstanding` unacked messages per subscription."""
    # Only the scheme is ever echoed back: the rest of the URL may hold a password.
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower() if sep else ""
    if scheme in REDIS_SCHEMES:
        return RedisStreamsBus(url, prefix, maxlen=maxlen)
    if scheme == "pubsub":
        # Imported here: google-cloud-pubsub is heavy, and only processes configured
        # for it should pay for the import.
        from router.bus.pubsub import PubSubBus
        from router.bus.pubsub_names import parse_project

        return PubSubBus(parse_project(url), prefix, max_outstanding=max_outstanding)
    accepted = ", ".join(f"{s}://" for s in (*REDIS_SCHEMES, "pubsub"))
    found = f"scheme {scheme!r}" if scheme else "a value without a scheme"
    raise ConfigError(f"IMROUTE_BUS_URL: {found} is not supported; use {accepted}")


def bus_from_settings(settings: Settings) -> Bus:
    """The bus a push service or gateway process is configured for."""
    return open_bus(
        settings.effective_bus_url,
        settings.redis_prefix,
        maxlen=settings.bus_maxlen,
        max_outstanding=settings.bus_max_outstanding,
    )
