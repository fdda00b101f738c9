"""The composition root: every router object is built here, once, from Settings.

`Wiring(settings)` checks what can be checked before the server starts (the Redis URL,
hedging, the dispatch rule) and builds the metrics; `Wiring.open()` opens Redis, the
gRPC client stack, the bus and the directory, and yields the `Services` the handlers
call. Only this module (and the services' type hints) names router adapters; that
includes the gRPC client stack to the gateways, and what the fleet cache tells it when
gateways leave or restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from push_service.idempotency.http import Idempotency
from push_service.live_stats import process_counts
from push_service.ratelimit.base import RateLimit, RateLimiter
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
from push_service.stores import ReceiptStore, StatsStore, Stores, redis_stores
from router.balancing import (
    Availability,
    ConnectReports,
    ConnectSettings,
    RetryPolicy,
    StatsRegistry,
    StatsSettings,
    rule_for,
)
from router.bus.base import Bus
from router.bus.factory import (
    bus_from_settings,
    bus_kind,
    check_bus_settings,
    hedging_from_settings,
)
from router.bus.metrics import BusLossMetrics
from router.directory.sql import SqlUserDirectory
from router.fanout.runner import JobRunner
from router.fleet.bus_agreement import BusAgreement
from router.fleet.cache import CachedFleet
from router.fleet.dispatch import ConnectHealth, Dispatcher
from router.gateway_rpc.client import (
    CLOSE_GRACE_S,
    CallMetrics,
    CoalescingGatewayClient,
    GrpcGatewayClients,
    ResilientGatewayClient,
)
from router.hedging.metrics import PublishMetrics
from router.jobs.reaper import reaping
from router.p2p.pusher import P2PPusher
from router.receipts.base import DELIVERED, ReceiptLimits, ReceiptUpdates
from router.receipts.unacked import UnackedSweeper
from router.redis.autopipe import AutoPipeline, auto_pipeline_for
from router.redis.client import RedisClient, create_redis
from router.routes.base import RouteRegistry
from router.routes.registry import RedisRouteRegistry
from router.stats.sampler import StatsSampler, sampling
from router.webhook.base import EventSink
from router.webhook.running import running_webhooks
from shared.auth import TokenRules
from shared.clock import Clock
from shared.http_heads import HeadLimits
from shared.internal_auth import load_tls
from shared.keys import KeySchema
from shared.models import GatewayInfo
from shared.settings import PushSettings, check_tracing
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


log = logging.getLogger(__name__)


class Wiring:
    """Builds the push service's objects from Settings; `open()` starts and stops them."""

    def __init__(
        self,
        settings: PushSettings,
        clock: Clock,
        bus: Bus | None = None,
        metrics: Sequence[Collector] = (),
        stores: Stores | None = None,
    ) -> None:
        """`bus`: a bus the caller opened and closes (a MemoryBus shared with in-process
        gateways); without it, the one IMROUTE_BUS_URL names is opened and closed here.
        `metrics`: the HTTP shell's own collectors, scraped with the rest. `stores`:
        the state's stores (router.testing's in-memory ones); without them, Redis's."""
        self._given_stores = stores
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
        # where producers (message.unacked) emit webhook events; set while open,
        # when IMROUTE_WEBHOOK_URL is set (None: webhooks off, nothing to emit)
        self.webhooks: EventSink | None = None
        self.unacked: UnackedSweeper | None = None  # sends message.unacked, while open
        self.auto: AutoPipeline | None = None  # shares Redis round trips, while open
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
            clients, call_stats = _gateway_clients(
                grpc_clients, settings, clock, self._call_metrics
            )
            stack.push_async_callback(clients.close)
            stores = self._given_stores or self._redis_stores(stack, redis)
            registry, recovery = stores.registry, stores.recovery
            # Gateways that leave the fleet take their channels and circuit stats along.
            fleet = CachedFleet(
                stores.fleet,
                clock,
                settings.gateway_cache_s,
                on_change=_after_read(
                    clients,
                    self._call_metrics,
                    "" if self._given_bus is not None else bus_kind(settings.effective_bus_url),
                ),
                on_started=_restarted(grpc_clients, call_stats),
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
            jobs = stores.jobs
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
            self._register(stack, _PusherCounts(pusher, registry))
            if settings.webhook_url is not None:
                self.webhooks = await stack.enter_async_context(
                    running_webhooks(settings, clock, keys, redis, registry, fleet, self._metrics)
                )
                stack.callback(setattr, self, "webhooks", None)
            self.parts = Parts(bus, fleet, call_stats, clients, grpc_clients)
            stack.callback(setattr, self, "parts", None)
            if self._rate is not None:
                self.rate_limiter = stores.rate_limiter(self._rate)
                stack.callback(setattr, self, "rate_limiter", None)
            receipts, on_receipts = await self._receipts(stack, stores.receipts)
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
            stats = stores.stats
            pushes = await self._live(
                stack, stats, pusher, on_receipts, fanout, call_stats, reports
            )
            idempotency = Idempotency.waiting_for_pushes(
                stores.idempotency, settings.deliver_timeout_s
            )
            # Its answers still being kept are written before Redis closes.
            stack.push_async_callback(idempotency.aclose)
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
                fleet=Fleet(fleet, stores.drains),
                fanout=fanout,
                users=Users(directory, registry),
                health=Health(stores.ping, self._metrics),
                idempotency=idempotency,
                receipts=ReceiptsView(receipts, clock, settings.recovery_window_s),
                webhooks=self.webhooks,
                overview=Overview(
                    fleet,
                    stats,
                    jobs,
                    ReceiptsView(receipts, clock, settings.recovery_window_s),
                    call_stats,
                    clock,
                ),
            )

    async def _live(
        self,
        stack: AsyncExitStack,
        stats: StatsStore,
        pusher: P2PPusher,
        receipts: Receipts | None,
        fanout: FanOut,
        calls: StatsRegistry,
        reports: ConnectReports,
    ) -> Pushes:
        """The P2P pushes, and the dashboard's figures: this process's counts go in
        `stats` every second until the stack closes."""
        pushes = Pushes(pusher, self._clock, receipts, traced=self.tracer is not None)
        counts = process_counts(pushes, fanout, self._publish_metrics, calls, reports)
        await stack.enter_async_context(sampling(StatsSampler(stats, self._clock, counts)))
        return pushes

    def _redis_stores(self, stack: AsyncExitStack, redis: RedisClient) -> Stores:
        """The stores on Redis; the P2P path's single commands share round trips
        (standalone Redis) until the stack closes."""
        auto = self.auto = auto_pipeline_for(redis)
        if auto is not None:
            stack.push_async_callback(auto.aclose)
        return redis_stores(self._settings, redis, self._clock, auto)

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
        self, stack: AsyncExitStack, receipts: ReceiptStore | None
    ) -> tuple[ReceiptStore | None, Receipts | None]:
        """The receipt store, and the P2P and fan-out paths' view of it; with webhooks,
        the message.unacked sweeper, running until the stack closes."""
        settings = self._settings
        rlimits = ReceiptLimits.from_settings(settings)
        if receipts is None or not rlimits.enabled:  # given stores too: off is off
            return None, None
        # message.unacked needs both the receipts and a webhook to send it to.
        unacked_ms = int(settings.webhook_unacked_s * 1000) if self.webhooks else 0
        slot_tag = self._keys.user_slot_tag
        view = Receipts(receipts, receipts, rlimits, settings.webhook_preview, unacked_ms, slot_tag)
        if self.webhooks is not None:
            self.unacked = UnackedSweeper(receipts, self.webhooks, self._clock)
            await stack.enter_async_context(self.unacked.running())
        return receipts, view


def _after_read(
    clients: CoalescingGatewayClient, call_metrics: CallMetrics, own_bus: str
) -> Callable[[Sequence[GatewayInfo]], None]:
    """What the fleet cache calls after each read: forget what departed gateways left,
    and warn of a gateway that hears another kind of bus than this push service
    publishes on (once per start of it): its clients would get broadcasts and group
    pushes only from the topic logs, late, or not at all."""
    agreement = BusAgreement(own_bus)

    def after(fresh: Sequence[GatewayInfo]) -> None:
        live = {g.gateway_id: g.grpc_address for g in fresh}
        clients.retain(live)
        call_metrics.retain(live)
        for g in agreement.newly_apart(fresh):
            log.warning(
                "gateway %s hears batches on a %s bus, this push service publishes them on "
                "a %s bus: it gets broadcasts and group pushes only from the topic logs, "
                "late, or not at all; give every process the same IMROUTE_BUS_URL "
                "(docs/operations/bus.md)",
                g.gateway_id,
                g.bus,
                own_bus,
            )

    return after


def _restarted(
    grpc_clients: GrpcGatewayClients, call_stats: StatsRegistry
) -> Callable[[str, str], None]:
    """What the fleet cache calls when a gateway announces a new start: a new channel
    (the old one may still be backing off from the crash) and a probe of its circuit now."""

    def restarted_(gateway_id: str, address: str) -> None:
        grpc_clients.reconnect(address)
        call_stats.restarted(gateway_id)

    return restarted_


def _gateway_clients(
    grpc_clients: GrpcGatewayClients,
    settings: PushSettings,
    clock: Clock,
    call_metrics: CallMetrics,
) -> tuple[CoalescingGatewayClient, StatsRegistry]:
    """gRPC to the gateways: coalesced, with stats, circuit breakers and retries."""
    stats = StatsRegistry(
        clock,
        StatsSettings(
            failure_threshold=settings.circuit_failures, cool_off_s=settings.circuit_cool_off_s
        ),
    )
    # Retries and the circuit count RPCs, below the coalescer: one failed DeliverMany is
    # one failure (and one retry of the whole call), however many pushes it carried.
    resilient = ResilientGatewayClient(
        grpc_clients,
        stats,
        RetryPolicy(max_retries_same=settings.deliver_retries),
        metrics=call_metrics,
    )
    return CoalescingGatewayClient(resilient, per_turn=True), stats


async def _retried(receipts: ReceiptUpdates, push_id: str, uids: Sequence[str]) -> None:
    """A background retry reached these recipients: delivered, in the push's receipt."""
    await receipts.mark(DELIVERED, {push_id: uids})


class _PusherCounts(Collector):
    """The P2P path's recovery counters, and its route reads Redis refused, read per
    scrape."""

    def __init__(self, pusher: P2PPusher, registry: RouteRegistry) -> None:
        self._pusher = pusher
        self._registry = registry

    def collect(self) -> Iterator[CounterMetricFamily]:
        registry = self._registry
        yield CounterMetricFamily(
            "imroute_route_reads_refused",
            "Route look-ups Redis refused, a user's route key of another type "
            "(WRONGTYPE): that user taken as offline",
            registry.unreadable if isinstance(registry, RedisRouteRegistry) else 0,
        )
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
        yield CounterMetricFamily(
            "imroute_push_not_retried_recipients",
            "Recipients of a failed, queued P2P push left to their inbox without a "
            "background retry: 10,000 pushes were being retried already",
            self._pusher.not_retried.total,
        )
        yield CounterMetricFamily(
            "imroute_push_retries_given_up_recipients",
            "Recipients of a failed, queued P2P push the background retries gave up on "
            "(their gateways kept failing for the retries' 23-46 s, or the push service "
            "stopped): the push waits in their inbox",
            self._pusher.given_up.total,
        )
