"""Where the push service keeps its state: the stores behind the router's seams, as one
bundle that `push_service.wiring` builds on Redis (`redis_stores`), or is given (the
in-memory ones of `router.testing`, so tests/api run the HTTP routes without Redis)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from push_service.idempotency.base import IdempotencyStore
from push_service.idempotency.store import RedisIdempotencyStore
from push_service.ratelimit.base import RateLimit, RateLimiter
from push_service.ratelimit.store import RedisRateLimiter
from router.fleet.base import DrainRequests, GatewayFleet
from router.fleet.drain import RedisDrainRequests
from router.fleet.store import RedisGatewayFleet
from router.jobs.base import JobStore, RecentJobs
from router.jobs.store import RedisJobStore
from router.receipts.base import ReceiptLimits, ReceiptLog, ReceiptReads, ReceiptUpdates
from router.receipts.store import RedisReceiptStore
from router.receipts.unacked import UnackedDue
from router.recovery.base import RecoveryLimits, RecoveryLog
from router.recovery.store import RedisRecoveryStore
from router.redis.autopipe import AutoPipeline
from router.redis.client import RedisClient, ping
from router.routes.base import GroupLookup, RouteRegistry
from router.routes.registry import RedisRouteRegistry, hash_reads_for
from router.stats.base import CountSums, StatsReads, StatsWrites
from router.stats.store import RedisStatsStore
from shared.clock import Clock
from shared.keys import KeySchema
from shared.settings import PushSettings

__all__ = ["JobRecords", "ReceiptStore", "RouteStore", "StatsStore", "Stores", "redis_stores"]


class RouteStore(RouteRegistry, GroupLookup, Protocol):
    """Userinfo, for P2P look-ups and multicast's groups."""


class JobRecords(JobStore, RecentJobs, Protocol):
    """Push jobs' records, for the runner, the API and the dashboard."""


class ReceiptStore(ReceiptLog, ReceiptUpdates, ReceiptReads, UnackedDue, Protocol):
    """Receipts: the router's writes, the retries' marks, the reads, message.unacked."""


class StatsStore(StatsWrites, StatsReads, CountSums, Protocol):
    """The dashboard's counts per interval, written by the sampler."""


@dataclass(frozen=True, slots=True)
class Stores:
    """The push service's stores. Webhooks (IMROUTE_WEBHOOK_URL) run on Redis only."""

    registry: RouteStore
    recovery: RecoveryLog
    fleet: GatewayFleet
    drains: DrainRequests
    jobs: JobRecords
    receipts: ReceiptStore | None  # None: receipts off (IMROUTE_RECEIPTS_TTL_S=0)
    stats: StatsStore
    idempotency: IdempotencyStore
    rate_limiter: Callable[[RateLimit], RateLimiter]  # built when IMROUTE_RATE_LIMIT is set
    ping: Callable[[], Awaitable[bool]]  # does the state answer (GET /healthz)


def redis_stores(
    settings: PushSettings, redis: RedisClient, clock: Clock, auto: AutoPipeline | None
) -> Stores:
    """Every store on Redis (`auto`: the P2P path's shared round trips)."""
    keys = KeySchema(settings.redis_prefix)
    rlimits = ReceiptLimits.from_settings(settings)
    return Stores(
        registry=RedisRouteRegistry(redis, keys, clock, reads=hash_reads_for(redis, auto)),
        recovery=RedisRecoveryStore(
            redis,
            keys,
            clock,
            RecoveryLimits.from_settings(settings),
            auto,
            topics_on_bus=settings.topic_log_on_bus,
        ),
        # The fleet's TTL is the gateways' to set; readers only read.
        fleet=RedisGatewayFleet(redis, keys, clock, ttl_s=1),
        drains=RedisDrainRequests(redis, keys),
        jobs=RedisJobStore(
            redis,
            keys,
            clock,
            lease_s=settings.job_lease_s,
            redis_timeout_s=settings.redis_timeout_s,
        ),
        receipts=RedisReceiptStore(redis, keys, rlimits, auto) if rlimits.enabled else None,
        stats=RedisStatsStore(redis, keys),
        idempotency=RedisIdempotencyStore(
            redis,
            keys,
            ttl_s=settings.idempotency_ttl_s,
            lease_s=settings.idempotency_lease_s,
        ),
        rate_limiter=functools.partial(RedisRateLimiter, redis, keys),
        ping=functools.partial(ping, redis),
    )
