"""The push service's FastAPI app: a thin HTTP shell over `router`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from push_service import dispatch_routes, group_routes, user_routes
from push_service.content import new_message
from push_service.deps import Key, Services, Svc
from push_service.limits import BodyLimit
from push_service.schemas import (
    GatewayOut,
    GatewaysOut,
    PushIn,
    PushOut,
    RouteOut,
    UserRouteOut,
)
from router.balancing import (
    Availability,
    Listeners,
    RetryPolicy,
    StatsRegistry,
    StatsSettings,
    rule_for,
)
from router.bus.factory import bus_from_settings, hedging_from_settings
from router.directory.sql import SqlUserDirectory
from router.fanout.runner import JobRunner
from router.fleet.cache import CachedFleet
from router.fleet.dispatch import Dispatcher
from router.fleet.store import RedisGatewayFleet
from router.gateway_rpc.coalescer import CoalescingGatewayClient
from router.gateway_rpc.grpc_client import CLOSE_GRACE_S, GrpcGatewayClients
from router.gateway_rpc.metrics import CallLog, CallMetrics
from router.gateway_rpc.resilient import ResilientGatewayClient
from router.hedging.metrics import PublishMetrics
from router.jobs.store import RedisJobStore
from router.p2p.pusher import P2PPusher
from router.redis.client import create_redis, ping
from router.routes.registry import RedisRouteRegistry
from shared.clock import Clock, SystemClock
from shared.errors import (
    AuthError,
    ConfigError,
    DirectoryUnavailable,
    ImrouteError,
    InvalidInput,
    PayloadTooLarge,
    RegistryUnavailable,
)
from shared.keys import KeySchema
from shared.settings import Settings

__all__ = ["create_app"]

log = logging.getLogger(__name__)

# The largest valid push (1000 uids of 128 characters and 64 KiB of content) fits.
MAX_BODY_BYTES = 1 << 20
# A million uids of up to 128 characters, quoted and comma-separated, plus content.
MAX_MULTICAST_BODY_BYTES = 160 << 20
# 10,000 users with 32 tags of 64 characters each.
MAX_USERS_BODY_BYTES = 32 << 20
JOB_LEASE_S = 10.0


def create_app(settings: Settings, clock: Clock | None = None) -> FastAPI:
    """Build the app; Redis and gRPC channels are opened by its lifespan."""
    if settings.api_key is None:
        raise ConfigError("IMROUTE_API_KEY: required by the push service")
    api_key = settings.api_key.get_secret_value()
    clock = clock or SystemClock()
    keys = KeySchema(settings.redis_prefix)

    # Built here, not in the lifespan, so a bad IMROUTE_REDIS_URL or hedging setting
    # stops the program with a message before the server starts.
    redis_client = create_redis(settings.redis_url, settings.redis_timeout_s)
    hedging_from_settings(settings)
    rule_for(settings.dispatch_rule, Availability(clock))  # a bad rule name stops it here
    # A registry per app, so several apps in one process (tests) never collide.
    metrics_registry = CollectorRegistry(auto_describe=True)
    publish_metrics = PublishMetrics(metrics_registry)
    call_metrics = CallMetrics(metrics_registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            redis = await stack.enter_async_context(contextlib.aclosing(redis_client))
            clients, call_stats = _gateway_clients(settings, clock, call_metrics)
            stack.push_async_callback(clients.close)
            registry = RedisRouteRegistry(redis, keys, clock)
            # The fleet's TTL is the gateways' to set; readers only read.
            # Gateways that leave the fleet take their channels and circuit stats along.
            fleet = CachedFleet(
                RedisGatewayFleet(redis, keys, clock, ttl_s=1),
                clock,
                settings.gateway_cache_s,
                on_change=_retain_all(clients, call_metrics),
            )
            bus = await stack.enter_async_context(bus_from_settings(settings, publish_metrics))
            directory = await stack.enter_async_context(
                SqlUserDirectory.from_url(settings.db_url, clock)
            )
            jobs = RedisJobStore(redis, keys, clock, lease_s=JOB_LEASE_S)
            runner = JobRunner(jobs, renew_s=JOB_LEASE_S / 3)
            stack.push_async_callback(runner.aclose)
            reaper = asyncio.create_task(_reap_forever(jobs), name="job-reaper")
            stack.push_async_callback(_cancel, reaper)
            app.state.services = Services(
                settings=settings,
                clock=clock,
                redis=redis,
                registry=registry,
                fleet=fleet,
                pusher=P2PPusher(registry, fleet, clients, settings.deliver_timeout_s),
                bus=bus,
                directory=directory,
                jobs=jobs,
                runner=runner,
                # One view of gateways' health, for P2P calls and for dispatch.
                dispatcher=Dispatcher(fleet, clock, settings.dispatch_rule, call_stats),
                call_stats=call_stats,
            )
            yield

    app = FastAPI(
        title="imroute push service",
        version="0.1.0",
        lifespan=lifespan,
        description="Push messages to users connected to imroute socket gateways.",
    )
    app.state.api_key = api_key
    _add_metrics(app, metrics_registry)

    _add_error_handlers(app)

    @app.post("/v1/push", dependencies=[Key], response_model=PushOut)
    async def push(body: PushIn, svc: Svc) -> JSONResponse:
        """Push one message to 1-1000 users wherever they are connected (P2P)."""
        message = new_message(body, clock.now_ms())
        expires_ms = message.ts_ms + body.ttl_s * 1000 if body.ttl_s else 0
        outcome = await svc.pusher.push(message, body.to, expires_ms)
        # Built directly: validating our own output through PushOut again is pure cost on
        # the hottest endpoint. PushOut still documents it in the OpenAPI schema.
        return JSONResponse(
            {
                "push_id": message.push_id,
                "msg_id": message.msg_id,
                "delivered": outcome.delivered,
                "offline": outcome.offline,
                "failed": outcome.failed,
                "errors": [{"gateway_id": e.gateway_id, "error": e.error} for e in outcome.errors],
            }
        )

    @app.get("/v1/users/{uid}/route", dependencies=[Key], response_model=UserRouteOut)
    async def user_route(
        uid: Annotated[str, Path(min_length=1, max_length=128)], svc: Svc
    ) -> UserRouteOut:
        """Where a user is connected right now (one entry per live connection)."""
        routes = (await svc.registry.lookup([uid])).get(uid, [])
        return UserRouteOut(
            uid=uid,
            online=bool(routes),
            routes=[
                RouteOut(gateway_id=r.gateway_id, group_id=r.group_id, ip=r.ip, port=r.port)
                for r in routes
            ],
        )

    @app.get("/v1/gateways", dependencies=[Key], response_model=GatewaysOut)
    async def gateways(svc: Svc) -> GatewaysOut:
        """The live gateways, as their heartbeats announce them."""
        svc.fleet.invalidate()
        return GatewaysOut(
            gateways=[
                GatewayOut(
                    gateway_id=g.gateway_id,
                    group_id=g.group_id,
                    ws_url=g.ws_url,
                    grpc_address=g.grpc_address,
                    connections=g.connections,
                )
                for g in await svc.fleet.live()
            ]
        )

    @app.get("/healthz")
    async def healthz(svc: Svc) -> JSONResponse:
        """200 when Redis answers, else 503. Needs no key."""
        if await ping(svc.redis):
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable", "detail": "redis"}, status_code=503)

    app.include_router(group_routes.router)
    app.include_router(user_routes.router)
    app.include_router(dispatch_routes.router)
    app.add_middleware(
        BodyLimit,
        max_bytes=MAX_BODY_BYTES,
        per_path={
            "/v1/multicast": MAX_MULTICAST_BODY_BYTES,
            "/v1/users": MAX_USERS_BODY_BYTES,
        },
    )
    return app


def _retain_all(
    clients: CoalescingGatewayClient, call_metrics: CallMetrics
) -> Callable[[Mapping[str, str]], None]:
    """What the fleet cache calls after each read: forget what departed gateways left."""

    def retain(live: Mapping[str, str]) -> None:
        clients.retain(live)
        call_metrics.retain(live)

    return retain


def _gateway_clients(
    settings: Settings, clock: Clock, call_metrics: CallMetrics
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
        GrpcGatewayClients(close_grace_s=max(CLOSE_GRACE_S, settings.deliver_timeout_s)),
        stats,
        RetryPolicy(max_retries_same=settings.deliver_retries),
        listeners=Listeners([call_metrics, CallLog()]),
    )
    return CoalescingGatewayClient(resilient), stats


def _add_error_handlers(app: FastAPI) -> None:
    """Our error tree as JSON: 401, 413, 422 naming the field, and 503."""

    @app.exception_handler(AuthError)
    async def _auth(_: Request, exc: AuthError) -> JSONResponse:
        return JSONResponse(
            {"error": "unauthorized", "detail": str(exc)},
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )

    @app.exception_handler(PayloadTooLarge)
    async def _too_large(_: Request, exc: PayloadTooLarge) -> JSONResponse:
        return JSONResponse(
            {
                "error": "payload_too_large",
                "detail": [{"field": exc.field, "message": exc.message}],
            },
            status_code=413,
        )

    @app.exception_handler(InvalidInput)
    async def _invalid(_: Request, exc: InvalidInput) -> JSONResponse:
        return JSONResponse(
            {"error": "invalid_request", "detail": [{"field": exc.field, "message": exc.message}]},
            status_code=422,
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        detail = [_describe_error(err) for err in exc.errors()]
        return JSONResponse({"error": "invalid_request", "detail": detail}, status_code=422)

    @app.exception_handler(RegistryUnavailable)
    @app.exception_handler(DirectoryUnavailable)
    async def _unavailable(_: Request, exc: ImrouteError) -> JSONResponse:
        what = (
            "route registry (Redis) unavailable; nothing was sent"
            if isinstance(exc, RegistryUnavailable)
            else "user directory unavailable (is it migrated? imroute db upgrade)"
        )
        log.warning("%s: %s", what, exc)
        return JSONResponse(
            {"error": "unavailable", "detail": what},
            status_code=503,
            headers={"Retry-After": "1"},
        )


def _add_metrics(app: FastAPI, registry: CollectorRegistry) -> None:
    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        """Prometheus metrics: publishing (and hedging) per topic."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


async def _reap_forever(jobs: RedisJobStore) -> None:
    """Fail jobs orphaned by a dead push service, at start and every half lease."""
    while True:
        try:
            reaped = await jobs.reap()
            if reaped:
                log.warning("marked %d orphaned push jobs failed", reaped)
        except ImrouteError as exc:
            log.warning("job reaper: %s", exc)
        await asyncio.sleep(JOB_LEASE_S / 2)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _describe_error(err: Any) -> dict[str, str]:
    if err.get("type") == "json_invalid":
        # FastAPI locates a JSON syntax error at ("body", <offset>); say so plainly.
        reason = (err.get("ctx") or {}).get("error", "")
        position = err["loc"][1] if len(err["loc"]) > 1 else "?"
        return {"field": "body", "message": f"invalid JSON at character {position}: {reason}"}
    return {"field": ".".join(str(p) for p in err["loc"]), "message": err["msg"]}
