"""The composition root: every router object is built here, once, from Settings.

`Wiring(settings)` checks what can be checked before the server starts (the Redis URL,
hedging, the dispatch rule) and builds the metrics; `Wiring.open()` opens Redis, the
gRPC client stack, the bus and the directory, and yields the `Services` the handlers
call. Only this module (and the services' type hints) names router adapters.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from push_service.gateway_stack import gateway_clients, restarted, retain_all
from push_service.idempotency import Idempotency
from push_service.live_stats import process_counts
from push_service.services import (
    Dispatch,
    FanOut,
    Fleet,
    Health,
    Overview,
    Pushes,
    Receipts,
    ReceiptsView,
    Services,
    Users,
)
from router.balancing import (
    Availability,
    ConnectReports,
    ConnectSettings,
    StatsRegistry,
    rule_for,
)
from router.bus.base import Bus
from router.bus.factory import bus_from_settings, check_bus_settings, hedging_from_settings
from router.bus.metrics import BusLossMetrics
from router.directory.sql import SqlUserDirectory
from router.fanout.runner import JobRunner
from router.fleet.cache import CachedFleet
from router.fleet.dispatch import ConnectHealth, Dispatcher
from router.fleet.drain import RedisDrainRequests
from router.fleet.store import RedisGatewayFleet
from router.gateway_rpc.coalescer import CoalescingGatewayClient
from router.gateway_rpc.grpc_client import CLOSE_GRACE_S, GrpcGatewayClients
from router.gateway_rpc.metrics import CallMetrics
from router.hedging.metrics import PublishMetrics
from router.idempotency.store import RedisIdempotencyStore
from router.jobs.reaper import reaping
from router.jobs.store import RedisJobStore
from router.p2p.pusher import P2PPusher
from router.ratelimit import RateLimit, RateLimiter, RedisRateLimiter
from router.receipts.base import DELIVERED, ReceiptLimits
from router.receipts.store import RedisReceiptStore
from router.receipts.unacked import UnackedSweeper
from router.recovery.base import RecoveryLimits
from router.recovery.store import RedisRecoveryStore
from router.redis.autopipe import AutoPipeline, auto_pipeline_for
from router.redis.client import RedisClient, create_redis, ping
from router.routes.reads import hash_reads_for
from router.routes.registry import RedisRouteRegistry
from router.stats.sampler import StatsSampler, sampling
from router.stats.store import RedisStatsStore
from router.webhook.base import EventSink
from router.webhook.running import running_webhooks
from shared.auth import TokenRules
from shared.clock import Clock
from shared.http_heads import HeadLimits
from shared.internal_auth import load_tls
from shared.keys import KeySchema
from shared.settings import Settings
from shared.trace_settings import check_tracing
from shared.tracing import Tracer

__all__ = ["Parts", "Wiring"]


@dataclass(frozen=True, slots=True)
class Parts:
    """The router objects behind the services, for tests and operators to inspect
    (`app.state.parts`); handlers never use them."""

    bus: Bus
    fleet: CachedFleet
    call_stats: StatsRegistry  # per-gateway stats and circuits, shared by P2P and dispatch
    gateway_clients: CoalescingGatewayClient  # the top of the gRPC client stack
    grpc_clients: GrpcGatewayClients  # its bottom: one channel per gateway


class Wiring:
    """Builds the push service's objects from Settings; `open()` starts and stops them."""

    def __init__(
        self,
        settings: Settings,
        clock: Clock,
        bus: Bus | None = None,
        metrics: Sequence[Collector] = (),
    ) -> None:
        """`bus`: a bus the caller opened and closes (a MemoryBus shared with in-process
        gateways); without it, the one IMROUTE_BUS_URL names is opened and closed here.
        `metrics`: the HTTP shell's own collectors, scraped with the rest."""
        self._settings = settings
        self._clock = clock
        self._given_bus = bus
        self._keys = KeySchema(settings.redis_prefix)
        # Built here, not in open(), so a bad IMROUTE_REDIS_URL or hedging setting
        # stops the program with a message before the server starts.
        self._redis = create_redis(settings.redis_url, settings.redis_timeout_s)
        hedging_from_settings(settings)
        if bus is None:
            check_bus_settings(settings)  # redis+cluster:// without IMROUTE_BUS_URL
        rule_for(settings.dispatch_rule, Availability(clock))  # a bad rule name stops it here
        # A registry per app, so several apps in one process (tests) never collide.
        self._metrics = CollectorRegistry(auto_describe=True)
        self._publish_metrics = PublishMetrics(self._metrics)
        self._call_metrics = CallMetrics(self._metrics)
        for collector in metrics:
            self._metrics.register(collector)
        self.parts: Parts | None = None  # set while open
        limit = settings.rate_limit
        # Parsed now: a bad IMROUTE_RATE_LIMIT stops the start, by name.
        self._rate = None if limit is None else RateLimit.parse(limit, settings.rate_burst)
        self.rate_limiter: RateLimiter | None = None  # set while open, when a limit is set
        # issue 13: where producers (message.unacked) emit webhook events; set while open,
        # when IMROUTE_WEBHOOK_URL is set (None: webhooks off, nothing to emit)
        self.webhooks: EventSink | None = None
        self.unacked: UnackedSweeper | None = None  # sends message.unacked, while open
        self.auto: AutoPipeline | None = None  # issue 14: shared round trips, while open
        self._tls = load_tls(settings)  # read now: a bad file stops the start, by name
        check_tracing(settings)  # a bad OTEL_EXPORTER_OTLP_ENDPOINT stops it too
        self.tracer: Tracer | None = None  # set while open, when tracing is on

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Services]:
        """Connect everything, yield the services, and close it all in reverse order."""
        settings, clock, keys = self._settings, self._clock, self._keys
        async with AsyncExitStack() as stack:
            tracer = self.tracer = await self._tracing(stack)
            redis = await stack.enter_async_context(contextlib.aclosing(self._redis))
            token = settings.internal_token
            grpc_clients = GrpcGatewayClients(
                close_grace_s=max(CLOSE_GRACE_S, settings.deliver_timeout_s),
                token=None if token is None else token.get_secret_value(),
                tls=self._tls,
                links=settings.delivery_link,
            )
            clients, call_stats = gateway_clients(grpc_clients, settings, clock, self._call_metrics)
            stack.push_async_callback(clients.close)
            # The P2P path's single commands share round trips (standalone Redis).
            auto = self.auto = auto_pipeline_for(redis)
            if auto is not None:
                stack.push_async_callback(auto.aclose)
            registry = RedisRouteRegistry(redis, keys, clock, reads=hash_reads_for(redis, auto))
            limits = RecoveryLimits.from_settings(settings)
            recovery = RedisRecoveryStore(redis, keys, clock, limits, auto)
            # The fleet's TTL is the gateways' to set; readers only read.
            # Gateways that leave the fleet take their channels and circuit stats along.
            fleet = CachedFleet(
                RedisGatewayFleet(redis, keys, clock, ttl_s=1),
                clock,
                settings.gateway_cache_s,
                on_change=retain_all(clients, self._call_metrics),
                on_started=restarted(grpc_clients, call_stats),
            )
            bus: Bus
            if self._given_bus is not None:
                bus = self._given_bus
            else:
                bus = await stack.enter_async_context(
                    bus_from_settings(settings, self._publish_metrics, tracer)
                )
            self._register(stack, BusLossMetrics(bus.losses))
            directory = await stack.enter_async_context(
                SqlUserDirectory.from_url(settings.db_url, clock)
            )
            lease_s = settings.job_lease_s
            jobs = RedisJobStore(redis, keys, clock, lease_s=lease_s)
            runner = JobRunner(
                jobs,
                renew_s=lease_s / 3,
                max_attempts=settings.job_max_attempts,
                grace_s=settings.job_shutdown_grace_s,
                tracer=tracer,
            )
            # Closed before the bus and the directory: jobs finish or hand over with both.
            stack.push_async_callback(runner.aclose)
            secret = settings.secret.get_secret_value() if settings.secret else None
            pusher = P2PPusher(
                registry, fleet, clients, settings.deliver_timeout_s, recovery, clock, tracer
            )
            stack.push_async_callback(pusher.aclose)
            self._register(stack, _PusherCounts(pusher))
            if settings.webhook_url is not None:
                self.webhooks = await stack.enter_async_context(
                    running_webhooks(settings, clock, keys, redis, registry, fleet, self._metrics)
                )
                stack.callback(setattr, self, "webhooks", None)
            self.parts = Parts(bus, fleet, call_stats, clients, grpc_clients)
            stack.callback(setattr, self, "parts", None)
            if self._rate is not None:
                self.rate_limiter = RedisRateLimiter(redis, keys, self._rate)
                stack.callback(setattr, self, "rate_limiter", None)
            receipts, on_receipts = await self._receipts(stack, redis)
            if receipts is not None:
                pusher.on_retried = functools.partial(_retried, receipts)
            fanout = FanOut(
                bus,
                directory,
                registry,
                runner,
                jobs,
                clock,
                batch_size=settings.batch_size,
                flush_timeout_s=settings.flush_timeout_s,
                recovery=recovery,
                receipts=on_receipts,
                tracer=tracer,
            )
            runner.resume_with(fanout.resume)
            # At start and every half lease: jobs orphaned by a dead push service (or handed
            # over by a stopping one) are resumed here, or failed. Stopped before the runner
            # closes, so a stopping service takes nothing new on.
            await stack.enter_async_context(reaping(runner, every_s=lease_s / 2))
            skip = ConnectSettings(
                settings.dispatch_skip_window_s,
                settings.dispatch_skip_min_failures,
                settings.dispatch_skip_ratio,
            )
            reports = ConnectReports(clock, skip.window_s)
            pushes, stats = await self._live(
                stack, redis, pusher, on_receipts, fanout, call_stats, reports
            )
            yield Services(
                pushes=pushes,
                # One view of gateways' health, for P2P calls and for dispatch.
                dispatch=Dispatch(
                    Dispatcher(
                        fleet,
                        clock,
                        settings.dispatch_rule,
                        call_stats,
                        ConnectHealth(stats, clock, skip, reports),
                    ),
                    secret,
                    clock,
                    settings.gateway_cache_s,
                    TokenRules.from_settings(settings),
                    HeadLimits.from_settings(settings),
                ),
                fleet=Fleet(fleet, RedisDrainRequests(redis, keys)),
                fanout=fanout,
                users=Users(directory, registry),
                health=Health(functools.partial(ping, redis), self._metrics),
                idempotency=Idempotency.waiting_for_pushes(
                    RedisIdempotencyStore(
                        redis,
                        keys,
                        ttl_s=settings.idempotency_ttl_s,
                        lease_s=settings.idempotency_lease_s,
                    ),
                    settings.deliver_timeout_s,
                ),
                receipts=ReceiptsView(receipts),
                webhooks=self.webhooks,
                overview=Overview(fleet, stats, jobs, ReceiptsView(receipts), call_stats, clock),
            )

    async def _live(
        self,
        stack: AsyncExitStack,
        redis: RedisClient,
        pusher: P2PPusher,
        receipts: Receipts | None,
        fanout: FanOut,
        calls: StatsRegistry,
        reports: ConnectReports,
    ) -> tuple[Pushes, RedisStatsStore]:
        """The P2P pushes, and the dashboard's figures: this process's counts go in every
        second until the stack closes; the store they go in."""
        pushes = Pushes(pusher, self._clock, receipts, traced=self.tracer is not None)
        stats = RedisStatsStore(redis, self._keys)
        counts = process_counts(pushes, fanout, self._publish_metrics, calls, reports)
        await stack.enter_async_context(sampling(StatsSampler(stats, self._clock, counts)))
        return pushes, stats

    def _register(self, stack: AsyncExitStack, collector: Collector) -> None:
        """`collector` scraped with the process's metrics until the stack closes."""
        self._metrics.register(collector)
        stack.callback(self._metrics.unregister, collector)

    async def _tracing(self, stack: AsyncExitStack) -> Tracer | None:
        """This process's tracer (tracing on), its spans sent at the end; or None."""
        if self._settings.otel_exporter_otlp_endpoint is None:
            return None
        from shared.tracing_setup import open_tracing  # the SDK, only when on

        tracing = open_tracing(
            self._settings, "imroute-push-service", f"{socket.gethostname()}:{os.getpid()}"
        )
        if tracing is None:
            return None
        stack.push_async_callback(asyncio.to_thread, tracing.shutdown)
        stack.callback(setattr, self, "tracer", None)
        return tracing.tracer

    async def _receipts(
        self, stack: AsyncExitStack, redis: RedisClient
    ) -> tuple[RedisReceiptStore | None, Receipts | None]:
        """The receipt store, and the P2P and fan-out paths' view of it; with webhooks,
        the message.unacked sweeper, running until the stack closes."""
        settings = self._settings
        rlimits = ReceiptLimits.from_settings(settings)
        if not rlimits.enabled:
            return None, None
        receipts = RedisReceiptStore(redis, self._keys, rlimits, self.auto)
        # message.unacked needs both the receipts and a webhook to send it to.
        unacked_ms = int(settings.webhook_unacked_s * 1000) if self.webhooks else 0
        view = Receipts(receipts, receipts, rlimits, settings.webhook_preview, unacked_ms)
        if self.webhooks is not None:
            self.unacked = UnackedSweeper(receipts, self.webhooks, self._clock)
            await stack.enter_async_context(self.unacked.running())
        return receipts, view


async def _retried(receipts: RedisReceiptStore, push_id: str, uids: Sequence[str]) -> None:
    """A background retry reached these recipients: delivered, in the push's receipt."""
    await receipts.mark(DELIVERED, {push_id: uids})


class _PusherCounts(Collector):
    """The P2P path's recovery counters, read per scrape."""

    def __init__(self, pusher: P2PPusher) -> None:
        self._pusher = pusher

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "imroute_inbox_dropped",
            "Inbox entries dropped, oldest first, to keep IMROUTE_INBOX_MAX",
            self._pusher.inbox_dropped,
        )
        yield CounterMetricFamily(
            "imroute_push_retried_recipients",
            "Recipients of a failed, queued P2P push that a background retry reached",
            self._pusher.retried,
        )
