"""Choosing the bus transport from IMROUTE_BUS_URL; every bus it gives is a HedgedBus."""

from __future__ import annotations

from router.bus.hedged import HedgedBus
from router.bus.memory import MemoryBus
from router.bus.redis_streams import (
    DEFAULT_GROUP_IDLE_S,
    DEFAULT_MAXLEN,
    RedisStreamsBus,
    TopicLog,
)
from router.bus.transport import BusTransport
from router.hedging import AUTO, HedgeObserver, HedgingSettings, RetrySettings, check_compatible
from shared.errors import ConfigError
from shared.settings import FleetSettings
from shared.tracing import Tracer

__all__ = [
    "DEFAULT_MAX_OUTSTANDING",
    "MEMORY_SCHEME",
    "REDIS_SCHEMES",
    "bus_from_settings",
    "bus_kind",
    "check_bus_settings",
    "hedging_from_settings",
    "open_bus",
    "topic_log_from_settings",
]

REDIS_SCHEMES = ("redis", "rediss", "unix")
MEMORY_SCHEME = "memory"
DEFAULT_MAX_OUTSTANDING = 100


def open_bus(
    url: str,
    prefix: str,
    *,
    maxlen: int = DEFAULT_MAXLEN,
    group_idle_s: float = DEFAULT_GROUP_IDLE_S,
    max_outstanding: int = DEFAULT_MAX_OUTSTANDING,
    hedging: HedgingSettings | None = None,
    observer: HedgeObserver | None = None,
    tracer: Tracer | None = None,
    topic_log: TopicLog | None = None,
) -> HedgedBus[BusTransport]:
    """The bus `url` names, hedged with `hedging`: Redis Streams for redis://, rediss://
    and unix://, keeping what a live gateway (one that read within `group_idle_s`) has
    not read, up to `maxlen` entries per topic; Google Cloud Pub/Sub for
    pubsub://PROJECT, holding at most `max_outstanding` unacked messages per
    subscription; an in-process bus of its own for memory:// (tests and examples).
    `topic_log`: a Redis Streams bus's streams are their topics' recovery logs too."""
    scheme = _scheme(url)
    if scheme in REDIS_SCHEMES:
        return RedisStreamsBus(
            url,
            prefix,
            maxlen=maxlen,
            group_idle_s=group_idle_s,
            hedging=hedging,
            observer=observer,
            tracer=tracer,
            topic_log=topic_log,
        )
    if scheme == MEMORY_SCHEME:
        return MemoryBus(hedging=hedging, observer=observer, tracer=tracer)
    # Imported here: google-cloud-pubsub is heavy, and only processes configured for it
    # should pay for the import.
    from router.bus.pubsub import PubSubBus
    from router.bus.pubsub_names import parse_project

    return PubSubBus(
        parse_project(url),
        prefix,
        max_outstanding=max_outstanding,
        hedging=hedging,
        observer=observer,
        tracer=tracer,
    )


def _scheme(url: str) -> str:
    """The scheme of a bus URL, lowercased; ConfigError naming those accepted for any
    other. Only the scheme is ever echoed back: the rest may hold a password."""
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower() if sep else ""
    accepted = (*REDIS_SCHEMES, "pubsub", MEMORY_SCHEME)
    if scheme in accepted:
        return scheme
    found = f"scheme {scheme!r}" if scheme else "a value without a scheme"
    named = ", ".join(f"{s}://" for s in accepted)
    raise ConfigError(f"IMROUTE_BUS_URL: {found} is not supported; use {named}")


CLUSTER_SCHEME = "redis+cluster"


def check_bus_settings(settings: FleetSettings) -> None:
    """Refuse, before anything opens, a bus the settings cannot give: the default bus is
    Redis Streams on IMROUTE_REDIS_URL, and a Redis Cluster cannot hold it (a gateway
    reads all its topics' streams in one XREADGROUP, which Cluster refuses across slots),
    so with redis+cluster:// the bus must be named; a scheme no bus has; a Pub/Sub URL
    without a project id, or without credentials (or an emulator) to reach it.
    ConfigError naming the fix."""
    if settings.bus_url is None and settings.redis_url.startswith(CLUSTER_SCHEME + "://"):
        raise ConfigError(
            "IMROUTE_BUS_URL: required when IMROUTE_REDIS_URL is a Redis Cluster "
            "(redis+cluster://), as the bus (Redis Streams) cannot run on a cluster: set "
            "IMROUTE_BUS_URL=redis://HOST:6379/0 (a standalone Redis for the bus) or "
            "pubsub://PROJECT (Google Cloud Pub/Sub)"
        )
    url = settings.effective_bus_url
    if _scheme(url) == "pubsub":
        from router.bus.pubsub_clients import check_credentials
        from router.bus.pubsub_names import parse_project

        parse_project(url)
        check_credentials()


def bus_kind(url: str) -> str:
    """The kind of bus `url` names, as a gateway's fleet record says it: `redis` (Redis
    Streams), `pubsub` or `memory`. The processes of one fleet must agree on it: a
    gateway on another bus than the push services hears none of their batches."""
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower() if sep else ""  # never the rest: it may hold a password
    return "redis" if scheme in REDIS_SCHEMES else scheme


def bus_from_settings(
    settings: FleetSettings, observer: HedgeObserver | None = None, tracer: Tracer | None = None
) -> HedgedBus[BusTransport]:
    """The bus a push service or gateway process is configured for; with `tracer`, each
    publish attempt is a span (shared.tracing)."""
    check_bus_settings(settings)
    return open_bus(
        settings.effective_bus_url,
        settings.redis_prefix,
        maxlen=settings.bus_maxlen,
        group_idle_s=settings.bus_group_idle_s,
        max_outstanding=settings.bus_max_outstanding,
        hedging=hedging_from_settings(settings),
        observer=observer,
        tracer=tracer,
        topic_log=topic_log_from_settings(settings),
    )


def topic_log_from_settings(settings: FleetSettings) -> TopicLog | None:
    """The streams as their topics' recovery logs, when the bus is Redis Streams on the
    recovery store's Redis (`FleetSettings.topic_log_on_bus`), unless the batches are
    logged apart while push services of the version before run
    (IMROUTE_TOPIC_LOG_LEGACY_WRITES). Readers read both layouts either way."""
    if not settings.topic_log_on_bus or settings.topic_log_legacy_writes:
        return None
    return TopicLog(int(settings.recovery_window_s * 1000), settings.recovery_topic_max)


HEDGE_VARS = "IMROUTE_HEDGE_DELAY_MS, IMROUTE_HEDGE_MAX_TOKENS, IMROUTE_HEDGE_REFILL_RATIO"


def hedging_from_settings(settings: FleetSettings) -> HedgingSettings | None:
    """Publish hedging as configured: on when IMROUTE_HEDGE_DELAY_MS is set; checked as
    HedgingSettings and against the publish retry settings. ConfigError when bad."""
    s = settings
    if s.hedge_delay_ms is None:
        if s.hedge_max_tokens is not None or s.hedge_refill_ratio is not None:
            raise ConfigError(
                "IMROUTE_HEDGE_MAX_TOKENS and IMROUTE_HEDGE_REFILL_RATIO take effect only "
                "with hedging on: set IMROUTE_HEDGE_DELAY_MS (milliseconds, or auto)"
            )
        return None
    delay: float | str = AUTO if s.hedge_delay_ms == AUTO else int(s.hedge_delay_ms) / 1000
    try:
        hedging = HedgingSettings(
            delay,  # type: ignore[arg-type]
            50 if s.hedge_max_tokens is None else s.hedge_max_tokens,
            0.1 if s.hedge_refill_ratio is None else s.hedge_refill_ratio,
        )
        check_compatible(hedging, RetrySettings(), message_ordering=False)
    except ValueError as exc:
        raise ConfigError(f"publish hedging ({HEDGE_VARS}): {exc}") from None
    return hedging
