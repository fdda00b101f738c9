"""One gateway process: the WebSocket endpoint, the gRPC service and the heartbeats."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from types import TracebackType

import grpc.aio

from router.bus.factory import bus_from_settings
from router.fleet.drain import RedisDrainRequests
from router.fleet.store import RedisGatewayFleet
from router.redis.client import RedisClient, connect_redis, ping
from router.routes.registry import RedisRouteRegistry
from router.routes.writer import CoalescingRouteWriter
from shared.clock import Clock, SystemClock
from shared.errors import ConfigError, ImrouteError, RegistryUnavailable
from shared.ids import ConnIdFactory
from shared.keys import KeySchema
from shared.models import GatewayInfo
from shared.settings import Settings, redact_url
from shared.wire import ws_text_frame
from socket_gateway.bus_consumer import consume, gateway_topics
from socket_gateway.connections import LocalConnections
from socket_gateway.dedup import RecentIds
from socket_gateway.delivery import DeliverService
from socket_gateway.grpc_server import start_grpc_server
from socket_gateway.metrics import GatewayMetrics, render
from socket_gateway.ws import WsEndpoint, WsServer

__all__ = ["CLOSE_DRAIN", "RECONNECT_FRAME", "Gateway"]

CLOSE_DRAIN = 4503
RECONNECT_FRAME = b'{"type":"reconnect","reason":"drain"}'
# After the last close of a drain, how long clients get to answer it.
DRAIN_CLOSE_GRACE_S = 5.0

log = logging.getLogger(__name__)

# The fleet record lapses after this many missed heartbeats.
FLEET_TTL_HEARTBEATS = 3


class Gateway:
    """`async with Gateway(settings) as gw:` serves until the block exits."""

    def __init__(
        self,
        settings: Settings,
        clock: Clock | None = None,
        grpc_interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    ) -> None:
        """`grpc_interceptors` wrap the gRPC service (tests and benchmarks inject faults)."""
        if settings.secret is None:
            raise ConfigError("IMROUTE_SECRET: required by the gateway to verify client tokens")
        self.settings = settings
        self.clock = clock or SystemClock()
        self._interceptors = tuple(grpc_interceptors)
        self.conns = LocalConnections(max_buffer=settings.max_write_buffer)
        self.deliver_service = DeliverService(self.conns, self.clock, RecentIds(self.clock))
        self.metrics = GatewayMetrics(self.deliver_service, self.conns)
        self.ws_port = 0
        self.grpc_port = 0
        self._stack = AsyncExitStack()
        self._tasks: list[asyncio.Task[None]] = []
        self._ws: WsEndpoint | None = None
        self._ws_server: WsServer | None = None
        self._grpc: grpc.aio.Server | None = None
        self._redis: RedisClient | None = None
        self.registry: RedisRouteRegistry | None = None
        self.fleet: RedisGatewayFleet | None = None
        self._started_ms = 0
        self.draining = False
        self.drained = asyncio.Event()
        self._drain_task: asyncio.Task[None] | None = None
        self._reregister: asyncio.Task[None] | None = None

    @property
    def info(self) -> GatewayInfo:
        s = self.settings
        host = self._advertise_host()
        ws_url = s.ws_public_url or f"ws://{_hostport(host, self.ws_port)}/ws"
        return GatewayInfo(
            s.gateway_id,
            s.group_id,
            ws_url,
            _hostport(host, self.grpc_port),
            len(self.conns),
            self._started_ms,
            max_connections=s.gateway_max_connections,
            zone=s.zone,
            draining=self.draining,
        )

    def _advertise_host(self) -> str:
        s = self.settings
        if s.advertise_host:
            return s.advertise_host
        if s.grpc_host in ("0.0.0.0", "::", ""):
            return socket.gethostbyname(socket.gethostname())
        return s.grpc_host

    async def __aenter__(self) -> Gateway:
        try:
            await self._start()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def _start(self) -> None:
        s = self.settings
        redis = await self._stack.enter_async_context(connect_redis(s.redis_url, s.redis_timeout_s))
        if not await ping(redis):
            raise RegistryUnavailable(
                f"no Redis answers at IMROUTE_REDIS_URL ({redact_url(s.redis_url)})"
            )
        self._redis = redis
        keys = KeySchema(s.redis_prefix)

        self._grpc, self.grpc_port = await start_grpc_server(
            self.deliver_service, s.grpc_host, s.grpc_port, self._interceptors
        )
        self._stack.push_async_callback(self._grpc.stop, 5)

        self._started_ms = self.clock.now_ms()
        self.registry = RedisRouteRegistry(
            redis,
            keys,
            self.clock,
            ttl_s=s.route_ttl_s,
            gateway_id=s.gateway_id,
            group_id=s.group_id,
            ip=self._advertise_host(),
            port=self.grpc_port,
        )
        self._writer = CoalescingRouteWriter(self.registry)
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
            metrics=lambda: render(self.metrics).decode(),
            max_connections=s.gateway_max_connections,
        )
        self._ws_server = await self._ws.serve(s.ws_host, s.ws_port)
        self.ws_port = self._ws_server.sockets[0].getsockname()[1]
        bus = await self._stack.enter_async_context(bus_from_settings(s))
        # Subscribed before announcing: a batch published once this gateway is visible
        # must already be owed to it.
        await bus.prepare(gateway_topics(s.group_id), s.gateway_id)
        # Announced only once both servers listen, so no route points at a dead port.
        await self.fleet.announce(self.info)
        self._stack.push_async_callback(self._shutdown)
        self._tasks = [
            asyncio.create_task(self._loop(s.heartbeat_s, self._announce), name="fleet-heartbeat"),
            asyncio.create_task(self._loop(s.route_ttl_s / 3, self._refresh), name="route-refresh"),
            asyncio.create_task(
                consume(bus, s.gateway_id, s.group_id, self.deliver_service), name="bus-consumer"
            ),
        ]

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.aclose()

    async def _shutdown(self) -> None:
        if self._reregister is not None:
            self._reregister.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reregister
        if self._drain_task is not None:
            self._drain_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain_task
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
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
        # wait_closed() waited for every connection and its unregister; the writer
        # flushes what is still queued.
        await self._writer.aclose()

    async def _loop(self, interval: float, beat: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await beat()
            except ImrouteError as exc:
                log.warning("heartbeat failed, retrying in %.1fs: %s", interval, exc)
            except Exception:
                # A heartbeat loop that died would let every route of this gateway expire
                # while its clients stay connected: log and keep beating.
                log.exception("heartbeat failed unexpectedly, retrying in %.1fs", interval)

    async def _announce(self) -> None:
        assert self.fleet is not None and self._redis is not None
        # A beat may take at most a heartbeat: with the fixed delay between beats, a slow
        # Redis then leaves at most two intervals between records, and the record's TTL
        # is three (a Redis command alone may take IMROUTE_REDIS_TIMEOUT_S, 5 s).
        interval = self.settings.heartbeat_s
        drains = RedisDrainRequests(self._redis, KeySchema(self.settings.redis_prefix))
        try:
            async with asyncio.timeout(interval):
                found = await self.fleet.announce(self.info)
                drain = not self.draining and await drains.requested(self.settings.gateway_id)
        except TimeoutError:
            raise RegistryUnavailable(
                f"announcing the fleet record took over a heartbeat ({interval}s)"
            ) from None
        if not found and (self._reregister is None or self._reregister.done()):
            # Our record was gone: Redis lost its data (a restart, a failover) or was
            # out of reach for a whole TTL. The routes are likely gone too: write every
            # local connection's now, not at the next route refresh. In a task of its
            # own, so that the next beats are not held up by it.
            log.warning("fleet record was missing: re-registering %d connections", len(self.conns))
            self._reregister = asyncio.create_task(self._refresh_logged(), name="re-register")
        if drain:  # POST /v1/gateways/{id}/drain
            self._drain_task = asyncio.create_task(self.drain(), name="drain")

    async def _refresh_logged(self) -> None:
        try:
            await self._refresh()
        except ImrouteError as exc:
            log.warning("re-registering connections failed (the route refresh retries): %s", exc)

    async def drain(self, window_s: float | None = None) -> None:
        """Stop taking clients, ask each to reconnect elsewhere, and close them (4503)
        spread over the drain window. Until its close, a client still gets its pushes;
        each close unregisters its route. `drained` is set at the end."""
        if self.draining:
            await self.drained.wait()
            return
        self.draining = True
        window = self.settings.drain_window_s if window_s is None else window_s
        assert self._ws is not None and self.fleet is not None
        self._ws.accepting = False
        with contextlib.suppress(ImrouteError):
            await self.fleet.announce(self.info)  # draining: dispatch stops choosing it
        self.conns.deliver_all(ws_text_frame(RECONNECT_FRAME))
        conns = list(self.conns)
        started = asyncio.get_running_loop().time()
        for i, conn in enumerate(conns):
            due = started + window * i / max(1, len(conns))
            await asyncio.sleep(max(0.0, due - asyncio.get_running_loop().time()))
            conn.sink.close(CLOSE_DRAIN, "gateway draining: reconnect elsewhere")
        deadline = asyncio.get_running_loop().time() + DRAIN_CLOSE_GRACE_S
        # The connection map has no change event: poll, for a bounded grace.
        while len(self.conns) and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        for conn in list(self.conns):
            conn.sink.abort()  # did not answer the close in time
        self.drained.set()

    async def _refresh(self) -> None:
        assert self.registry is not None
        snapshot = self.conns.registrations()
        await self.registry.refresh(snapshot)
        # A client that left while the refresh was in flight must not stay routed.
        gone = [r for r in snapshot if not self.conns.holds_registration(r)]
        if gone:
            await self.registry.unregister_many(gone)


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
