"""One gateway process: composes the WebSocket endpoint, the gRPC service, the bus
consumer and the heartbeat, and starts and stops them in order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Self

import grpc.aio

from router.bus.base import Bus
from router.bus.factory import bus_from_settings, bus_kind, check_bus_settings
from router.fleet.drain import RedisDrainRequests
from router.fleet.store import RedisGatewayFleet
from router.receipts.base import ReceiptLimits
from router.receipts.store import RedisReceiptStore
from router.recovery.base import RecoveryLimits
from router.recovery.store import RedisRecoveryStore
from router.redis.autopipe import auto_pipeline_for
from router.redis.client import connect_redis, unanswered
from router.routes.registry import RedisRouteRegistry
from router.routes.writer import CoalescingRouteWriter
from router.webhook import presence as wh_presence
from shared.auth import TokenRules
from shared.clock import Clock, SystemClock
from shared.closing import ClosedOnExit
from shared.errors import ConfigError, ImrouteError, RegistryUnavailable
from shared.ids import ConnIdFactory
from shared.internal_auth import is_loopback, load_tls
from shared.keys import KeySchema
from shared.models import GatewayInfo
from shared.settings import GatewaySettings, check_tracing, redact_url
from shared.throttled import ThrottledLine
from shared.uids import REFUSED
from socket_gateway.acks import AckReporter
from socket_gateway.advertise import advertised
from socket_gateway.bus_consumer import UNREADABLE, consume, gateway_topics
from socket_gateway.connections import MAX_UNACKED, LocalConnections
from socket_gateway.delivery import DeliverService, RecentIds
from socket_gateway.delivery_ports import DeliveryPorts, open_delivery_ports
from socket_gateway.follower import TopicFollower
from socket_gateway.grpc_auth import TokenCheck
from socket_gateway.heartbeat import (
    CLOSE_DRAIN,
    FLEET_TTL_HEARTBEATS,
    RECONNECT_FRAME,
    Drain,
    Heartbeat,
)
from socket_gateway.identity import claim_id
from socket_gateway.live_stats import gateway_sampling
from socket_gateway.metrics import Counted, GatewayMetrics, render
from socket_gateway.metrics_http import refused_heads, serve_metrics
from socket_gateway.resume import Resumer
from socket_gateway.resume_budget import ResumeLimits
from socket_gateway.supervise import RestartBudget
from socket_gateway.tracing import gateway_tracing
from socket_gateway.ws.admission import HandshakeLimits
from socket_gateway.ws.conn import LimitCounts
from socket_gateway.ws.endpoint import WsEndpoint, WsServer
from socket_gateway.ws.protocol import WsTimers
from socket_gateway.ws.ratelimit import FrameRate

__all__ = ["CLOSE_DRAIN", "RECONNECT_FRAME", "Gateway"]

log = logging.getLogger(__name__)


class Gateway(ClosedOnExit):
    """`async with Gateway(settings) as gw:` serves until the block exits."""

    def __init__(
        self,
        settings: GatewaySettings,
        clock: Clock | None = None,
        grpc_interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        bus: Bus | None = None,
    ) -> None:
        """`grpc_interceptors` wrap the gRPC service (test faults; then no delivery link);
        `bus`: one the caller owns (a MemoryBus shared with an in-process push service),
        else the one IMROUTE_BUS_URL names, opened and closed with the gateway."""
        if settings.secret is None:
            raise ConfigError("IMROUTE_SECRET: required by the gateway to verify client tokens")
        clock_ = clock or SystemClock()
        self._tls = load_tls(settings)
        check_tracing(settings)  # a bad OTEL_EXPORTER_OTLP_ENDPOINT stops the start here
        if bus is None:
            check_bus_settings(settings)  # redis+cluster:// without IMROUTE_BUS_URL
        open_port = not is_loopback(settings.grpc_host)
        if open_port and settings.internal_token is None and self._tls is None:
            raise ConfigError(
                "IMROUTE_INTERNAL_TOKEN: required when the gateway's gRPC listens beyond "
                f"this machine (IMROUTE_GRPC_HOST={settings.grpc_host}), or mTLS "
                "(IMROUTE_GRPC_TLS_CERT, _KEY and _CA): anyone who reaches the port "
                "could push to any user"
            )
        # Decided now, so a wildcard bind with no address to announce stops the start.
        self._advertised = advertised(
            settings.ws_host, settings.grpc_host, settings.advertise_host, settings.ws_public_url
        )
        self.settings = settings
        self.clock = clock_
        token = settings.internal_token
        # The token check comes first: nothing else sees a call that lacks it.
        self.token_check = None if token is None else TokenCheck(token.get_secret_value(), clock_)
        auth = () if self.token_check is None else (self.token_check,)
        self._interceptors = (*auth, *grpc_interceptors)
        self._offer_link = not grpc_interceptors
        self._given_bus = bus
        self.conns = LocalConnections(max_buffer=settings.max_write_buffer)
        slow = ThrottledLine(
            log,
            "aborted %(n)d slow consumer(s) since the last line: more than %(max)d bytes "
            "unsent (IMROUTE_MAX_WRITE_BUFFER; the last had %(unsent)d); stored pushes come "
            "back on their next connect",
            now=self.clock.monotonic,
        )
        self.conns.on_slow = lambda unsent: slow.note(max=self.conns.max_buffer, unsent=unsent)
        self.conns.marks.group = settings.group_id
        self.deliver_service = DeliverService(self.conns, self.clock, RecentIds(self.clock))
        self.follower: TopicFollower | None = None
        self.resumer: Resumer | None = None
        self.acks: AckReporter | None = None
        # Set when it gave up on the bus consumer: it drains, and exits 1 to be restarted.
        self.failure: str | None = None
        self.consumer_restarts = 0
        self.consumer_budget = RestartBudget(self.clock)
        self._ws: WsEndpoint | None = None  # before the metrics, which read it at once
        self.metrics_refused = refused_heads()  # heads the metrics port refused (431, 414)
        self.limit_counts = LimitCounts(self.clock.monotonic)
        self.metrics = GatewayMetrics(
            self.deliver_service, self.conns, self.counts, self.limit_counts
        )
        self.ws_port = 0
        self.grpc_port = 0
        self.metrics_port: int | None = None  # the internal /metrics port, when one is set
        self._stack = AsyncExitStack()
        self._consumer: asyncio.Task[None] | None = None
        self._following: asyncio.Task[None] | None = None
        self._ws_server: WsServer | None = None
        self.ports: DeliveryPorts | None = None  # gRPC and the delivery link, while open
        self.registry: RedisRouteRegistry | None = None
        self.fleet: RedisGatewayFleet | None = None
        self._heartbeat: Heartbeat | None = None
        self._bus: Bus | None = None  # once subscribed
        self._started_ms = 0
        self._drain = Drain(self.conns)

    @property
    def ws_endpoint(self) -> WsEndpoint | None:
        return self._ws

    @property
    def draining(self) -> bool:
        return self._drain.draining

    @property
    def drained(self) -> asyncio.Event:
        """Set once a drain has closed every client."""
        return self._drain.drained

    @property
    def info(self) -> GatewayInfo:
        s = self.settings
        hosts = self._advertised
        ws_url = s.ws_public_url or f"ws://{_hostport(hosts.ws_host, self.ws_port)}/ws"
        return GatewayInfo(
            s.gateway_id,
            s.group_id,
            ws_url,
            _hostport(hosts.grpc_host, self.grpc_port),
            len(self.conns),
            self._started_ms,
            max_connections=s.gateway_max_connections,
            zone=s.zone,
            draining=self.draining,
            # Said for the push services to check theirs against; unknown for a bus given
            # by the caller (in-process, shared with the push service).
            bus="" if self._given_bus is not None else bus_kind(s.effective_bus_url),
        )

    async def __aenter__(self) -> Self:
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise
        return self

    async def _start(self) -> None:
        s = self.settings
        redis = await self._stack.enter_async_context(connect_redis(s.redis_url, s.redis_timeout_s))
        if (why := await unanswered(redis)) is not None:
            raise RegistryUnavailable(
                f"no Redis answers at IMROUTE_REDIS_URL ({redact_url(s.redis_url)}): {why}"
            )
        keys = KeySchema(s.redis_prefix)
        tracing = self.deliver_service.tracing = await gateway_tracing(self._stack, s)
        self.ports = await open_delivery_ports(
            self._stack, self.deliver_service, s, self._interceptors, self._tls,
            self.clock, self._offer_link,
        )  # fmt: skip
        self.grpc_port = self.ports.grpc_port
        self._started_ms = self.clock.now_ms()
        self.presence = wh_presence.from_settings(s, redis, keys, self.clock)  # webhooks on
        self.registry = RedisRouteRegistry(
            redis,
            keys,
            self.clock,
            ttl_s=s.route_ttl_s,
            gateway_id=s.gateway_id,
            group_id=s.group_id,
            ip=self._advertised.grpc_host,
            port=self.grpc_port,
            max_per_user=s.max_connections_per_user,
            presence=self.presence,
        )
        self._writer = CoalescingRouteWriter(self.registry)
        auto = auto_pipeline_for(redis)  # the acks' writes: packed and parsed at once
        recovery = RedisRecoveryStore(
            redis,
            keys,
            self.clock,
            RecoveryLimits.from_settings(s),
            auto,
            topics_on_bus=s.topic_log_on_bus,
        )
        self.follower = TopicFollower(
            recovery, self.deliver_service, self.conns.marks, gateway_topics(s.group_id), self.clock
        )
        rlimits = ReceiptLimits.from_settings(s)
        receipts = RedisReceiptStore(redis, keys, rlimits, auto) if rlimits.enabled else None
        self.acks = AckReporter(
            self.conns, recovery, receipts, self.clock, tracing=tracing, inbox_max=s.inbox_max
        )
        self.deliver_service.report = self.acks.report
        await self._stack.enter_async_context(gateway_sampling(redis, keys, self))  # dashboard
        self.resumer = Resumer(
            recovery, self.conns, recovery.limits, self.clock, self.follower.recent,
            report=self.acks.report,
            # an old gateway's fleet TTL, a group's flush, a publish's retries
            move_tail_s=s.heartbeat_s * FLEET_TTL_HEARTBEATS + s.flush_timeout_s + 10.0,
            budget=ResumeLimits.from_settings(s),  # what one resume may read
        )  # fmt: skip
        self.conns.gap_filler = self.resumer.fill_gap
        # From the logs' heads, before the first client: each starts where the topics are.
        await self.follower.start()
        self.fleet = RedisGatewayFleet(
            redis, keys, self.clock, s.heartbeat_s * FLEET_TTL_HEARTBEATS
        )
        assert s.secret is not None
        self._ws = WsEndpoint(
            self.conns,
            s.secret.get_secret_value(),
            self.clock,
            ConnIdFactory(s.gateway_id),
            self._writer.register,
            self._writer.unregister,
            max_connections=s.gateway_max_connections,
            resumer=self.resumer,
            timers=WsTimers(handshake_s=s.ws_handshake_timeout_s),
            token_rules=TokenRules.from_settings(s),
            limits=HandshakeLimits.from_settings(s),
            frame_rate=(
                FrameRate(s.ws_client_frame_rate, s.ws_client_frame_burst)
                if s.ws_client_frame_rate
                else None
            ),
            limit_counts=self.limit_counts,
            acks=self.acks,
        )
        self._ws_server = await self._ws.serve(s.ws_host, s.ws_port)
        self.ws_port = self._ws_server.sockets[0].getsockname()[1]
        if s.metrics_port is not None:
            scrapes = await serve_metrics(s, lambda: render(self.metrics), self.metrics_refused)
            self._stack.push_async_callback(scrapes.wait_closed)
            self._stack.callback(scrapes.close)  # first: the stack unwinds last in, first out
            self.metrics_port = scrapes.sockets[0].getsockname()[1]
        bus: Bus
        if self._given_bus is not None:
            bus = self._given_bus
        else:
            bus = await self._stack.enter_async_context(bus_from_settings(s))
        # Subscribed before announcing: a batch published once this gateway is visible
        # must already be owed to it.
        await bus.prepare(gateway_topics(s.group_id), s.gateway_id)
        self._bus = bus
        await claim_id(self.fleet, s.gateway_id, self.info.grpc_address, self.clock)
        await wh_presence.adopt_last_run(self.presence, s.gateway_id)  # the id is ours now
        # Announced only once both servers listen, so no route points at a dead port.
        await self.fleet.announce(self.info)
        self._stack.push_async_callback(self._shutdown)
        self._heartbeat = Heartbeat(
            s.gateway_id,
            s.heartbeat_s,
            s.route_ttl_s,
            self.conns,
            self.fleet,
            self.registry,
            RedisDrainRequests(redis, keys),
            lambda: self.info,
            self._drain,
            self.drain,
            caught_up=self.resumer.catch_up,
            presence=self.presence,
        )
        self._heartbeat.start()
        self._consumer = asyncio.create_task(self._consume(bus), name="bus-consumer")
        self._following = asyncio.create_task(self.follower.run(), name="topic-follower")

    async def _consume(self, bus: Bus) -> None:
        """The bus consumer, restarted when it dies of an unexpected error; when it keeps
        dying, the gateway drains rather than stay in the fleet deaf to the bus."""
        s = self.settings
        assert self.follower is not None
        budget = self.consumer_budget
        while True:
            try:
                await consume(bus, s.gateway_id, s.group_id, self.follower.offer)
                return  # the bus closed: the gateway is stopping
            except Exception as exc:
                delay = budget.failed()
                if delay is None:
                    self.failure = (
                        f"the bus consumer failed {budget.recent} times within a minute "
                        f"(last: {type(exc).__name__}: {exc})"
                    )
                    log.exception("%s: draining this gateway", self.failure)
                    await self.drain()
                    return
                self.consumer_restarts += 1
                log.exception("the bus consumer failed; restarting it in %.1fs", delay)
                await asyncio.sleep(delay)

    async def close(self) -> None:
        """Stop everything started, in the reverse order."""
        await self._stack.aclose()

    async def _shutdown(self) -> None:
        # Registered before the heartbeat and the consumer: a start failed between gets here.
        if self._heartbeat is not None:
            await self._heartbeat.aclose()
        for task in (self._consumer, self._following):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        assert self._ws is not None and self._ws_server is not None
        assert self.fleet is not None and self.registry is not None
        self._ws.accepting = False
        # Withdraw first so the router stops choosing this gateway, then say goodbye (1001).
        with contextlib.suppress(ImrouteError):
            await self.fleet.withdraw(self.settings.gateway_id)
        self._ws_server.close(close_connections=True)
        await self._ws_server.wait_closed()
        if self.resumer is not None:
            await self.resumer.aclose()
        # Every connection and its unregister are done; the writer and acks flush the rest.
        await self._writer.aclose()
        if self.acks is not None:
            await self.acks.aclose()
        await wh_presence.retire(self.presence, self.settings.gateway_id)
        if self._bus is not None:
            # Its clients are gone: nothing published from here on is owed to it.
            with contextlib.suppress(ImrouteError):
                await self._bus.leave(
                    gateway_topics(self.settings.group_id), self.settings.gateway_id
                )

    async def drain(self, window_s: float | None = None) -> None:
        """Stop taking clients, ask each to reconnect elsewhere, and close them (4503)
        spread over the drain window. Until its close, a client still gets its pushes;
        each close unregisters its route. `drained` is set at the end."""
        assert self._ws is not None and self.fleet is not None
        window = self.settings.drain_window_s if window_s is None else window_s
        await self._drain.run(window, self._ws, self.fleet, lambda: self.info)

    def counts(self) -> dict[str, tuple[str, float]]:
        """The gateway's own counters for /metrics beyond the delivery counts: name ->
        (help, value), read at each scrape."""
        conns, deliveries = self.conns, self.deliver_service
        counts: dict[str, tuple[str, float]] = {
            "rejected_batches": (
                "Batches refused as malformed (content not one JSON value, ids or counts "
                "over their caps): nothing of them was written",
                deliveries.rejected.total,
            ),
            "unreadable_batches": (
                "Bus entries no gateway can read (not a batch, or a bad seq or epoch "
                "attribute): dropped",
                UNREADABLE.total,
            ),
            "bus_consumer_restarts": (
                "Times the bus consumer died of an unexpected error and was restarted",
                self.consumer_restarts,
            ),
            "dedupe_evicted_early": (
                "Batch ids forgotten before their dedupe window ran out (its count or byte "
                "cap): a duplicate of one would be written again",
                deliveries.evicted_early,
            ),
            "uids_refused": (
                "uids refused by the uid rule: a client token's sub (also counted in "
                "handshakes_refused_unauthorized)",
                REFUSED.total,
            ),
            "metrics_heads_refused": (
                "Requests to the metrics port refused for a request head over a limit "
                "(IMROUTE_HTTP_MAX_HEAD_BYTES, _MAX_HEADERS: 431; _MAX_URL_BYTES: 414)",
                self.metrics_refused.total,
            ),
            "unacked_forgotten": (
                f"Pushes a connection was sent and never acked, past the {MAX_UNACKED} it "
                "is remembered for: still in the inbox, sent again on the next connect",
                conns.unacked_forgotten,
            ),
            "slow_consumers_aborted": (
                "Connections aborted with more than IMROUTE_MAX_WRITE_BUFFER bytes unsent: "
                "what was unsent is lost to them (a stored push comes back on their next "
                "connect)",
                conns.slow_aborted,
            ),
        }
        if self.token_check is not None:
            counts["unauthenticated_calls"] = (
                "gRPC calls refused for a missing or wrong IMROUTE_INTERNAL_TOKEN",
                self.token_check.refused,
            )
        # Each part that counts more says what (name -> (help, value)).
        refusals = self.ws_endpoint.refusals if self.ws_endpoint is not None else None
        parts: tuple[Counted | None, ...] = (refusals, self.resumer, self.follower, self.acks)
        for part in parts:
            if part is not None:
                counts.update(part.metrics())
        return counts


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
