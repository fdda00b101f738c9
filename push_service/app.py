"""The push service's FastAPI app: a thin HTTP shell over `router`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI
from fastapi.routing import APIRoute

from push_service.admission import (
    AccessRules,
    Admission,
    ApiKeys,
    LimiterSlot,
    Shedder,
    ShedMetrics,
)
from push_service.cors import ClientCors
from push_service.errors import ServerErrors, UnavailableMetrics, add_error_handlers
from push_service.fast_push import FastPush, ServicesSlot
from push_service.http_server import HeadCounts, HeadCuts
from push_service.pages import add_pages
from push_service.routes import ROUTERS
from push_service.routes.deps import KEY_SCHEMES
from push_service.stores import Stores
from push_service.tracing_http import TracerSlot
from push_service.uid_metrics import UidMetrics
from push_service.wiring import Wiring
from push_service.worker import Worker
from router.bus.base import Bus
from router.processes.procs import take_stop_signals
from shared.clock import Clock, SystemClock
from shared.errors import ConfigError
from shared.settings import PushSettings
from shared.throttled import say_held

__all__ = ["Worker", "create_app"]

# The largest valid push (1000 uids of 128 characters and 64 KiB of content) fits.
MAX_BODY_BYTES = 1 << 20
# A million uids of up to 128 characters, quoted and comma-separated, plus content.
MAX_MULTICAST_BODY_BYTES = 160 << 20
# 1000 messages of typical size (a few KiB of content and recipients each).
MAX_BATCH_BODY_BYTES = 32 << 20
# 10,000 users with 32 tags of 64 characters each.
MAX_USERS_BODY_BYTES = 32 << 20


def create_app(
    settings: PushSettings,
    clock: Clock | None = None,
    bus: Bus | None = None,
    worker: Worker | None = None,
    on_ready: Callable[[], None] | None = None,
    stores: Stores | None = None,
) -> FastAPI:
    """Build the app; Redis and gRPC channels are opened by its lifespan. `bus`: one the
    caller owns, e.g. a MemoryBus shared with gateways in the same process. `worker`:
    this process is one of several (IMROUTE_WORKERS). `on_ready`: called once the
    services are open. `stores`: the state's stores, when not Redis's (tests/api)."""
    if settings.api_key is None:
        raise ConfigError("IMROUTE_API_KEY: required by the push service")
    shedder = Shedder(settings.http_max_in_flight, settings.http_max_lag_ms)
    # What the server cuts before a request is whole (push_service.http_server.run).
    heads = HeadCounts(HeadCuts(settings.http_header_timeout_s))
    metrics = [ShedMetrics(shedder), UidMetrics(), UnavailableMetrics(), heads]
    wiring = Wiring(settings, clock or SystemClock(), bus, metrics, stores)
    slot = LimiterSlot()
    services_slot = ServicesSlot()
    traced = TracerSlot()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Inside uvicorn's run, its SIGINT and SIGTERM handlers are in place: a stop a
        # worker's supervisor sent while it started, held till now, is handled (uvicorn
        # stops once the start is done).
        take_stop_signals()
        try:
            async with AsyncExitStack() as stack:
                services = await stack.enter_async_context(wiring.open())
                await stack.enter_async_context(shedder.running())
                if worker is not None:
                    services.health.siblings = worker
                    await stack.enter_async_context(
                        worker.sharing_metrics(services.health.own_scrape)
                    )
                    worker.mark_ready()
                if on_ready is not None:
                    on_ready()
                app.state.services = services_slot.services = services
                app.state.parts = wiring.parts
                slot.limiter = wiring.rate_limiter
                traced.tracer = wiring.tracer
                try:
                    yield
                finally:
                    slot.limiter = None
                    services_slot.services = None
                    traced.tracer = None
        finally:
            say_held()  # closed: what its throttled lines hold back, before the process goes

    app = FastAPI(
        title="imroute push service",
        version="0.1.0",
        lifespan=lifespan,
        description="Push messages to users connected to imroute socket gateways.",
        # Served by push_service.pages, from the package (FastAPI's load a CDN's script).
        docs_url=None,
        redoc_url=None,
        # Traced by push_service.tracing_http when on; FastAPI's own telemetry, off, still
        # read three settings from the environment per request (2 % of a push's CPU).
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    keys = ApiKeys.from_settings(settings)
    app.state.keys = keys
    app.state.head_counts = heads
    add_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    # The gate's patterns as the router's own ({uid:uid} spans segments).
    regexes = {
        r.path_format: r.path_regex
        for router in ROUTERS
        for r in router.routes
        if isinstance(r, APIRoute)
    }
    # The dashboard, the browser client and /docs, each page under its own CSP.
    add_pages(app, settings.dashboard_connect_src)
    # Innermost: POST /v1/push's hot path, behind every gate (push_service.fast_push).
    app.add_middleware(FastPush, slot=services_slot, handlers=app.exception_handlers)
    # Added later, so it runs earlier: load, key, rate and body size, each refused from
    # the headers alone (push_service.admission).
    app.add_middleware(
        Admission,
        shedder=shedder,
        keys=keys,
        rules=AccessRules.from_openapi(app.openapi(), KEY_SCHEMES, regexes),
        limiter=slot,
        traced=traced if settings.otel_exporter_otlp_endpoint is not None else None,
        max_bytes=MAX_BODY_BYTES,
        per_path={
            "/v1/multicast": MAX_MULTICAST_BODY_BYTES,
            "/v1/push/batch": MAX_BATCH_BODY_BYTES,
            "/v1/users": MAX_USERS_BODY_BYTES,
        },
    )
    # What no handler took is a JSON 500, the connection kept clean.
    app.add_middleware(ServerErrors)
    # Outermost: a browser's preflight of the client-facing paths, answered from the
    # headers alone, and the page's origin on every answer to it, a 500 included
    # (push_service.cors); no layer at all unless origins are listed.
    if settings.cors_origins:
        app.add_middleware(ClientCors, origins=settings.cors_origins.split())
    return app
