"""The push service's FastAPI app: a thin HTTP shell over `router`."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from push_service.limits import BodyLimit
from push_service.schemas import (
    MAX_CONTENT_BYTES,
    GatewayOut,
    GatewaysOut,
    PushIn,
    PushOut,
    RouteOut,
    UserRouteOut,
)
from router.coalescer import CoalescingGatewayClient
from router.fleet import CachedFleet, RedisGatewayFleet
from router.gateway_client import GrpcGatewayClients
from router.p2p import P2PPusher
from router.redis_client import RedisClient, create_redis, ping
from router.registry import RedisRouteRegistry
from shared.auth import api_key_matches
from shared.clock import Clock, SystemClock
from shared.errors import AuthError, ConfigError, InvalidInput, PayloadTooLarge, RegistryUnavailable
from shared.ids import new_id
from shared.keys import KeySchema
from shared.models import Message
from shared.settings import Settings

__all__ = ["create_app"]

log = logging.getLogger(__name__)

# The largest valid push (1000 uids of 128 characters and 64 KiB of content) fits.
MAX_BODY_BYTES = 1 << 20


@dataclass
class Services:
    redis: RedisClient
    registry: RedisRouteRegistry
    fleet: CachedFleet
    pusher: P2PPusher


# Dependencies are async on purpose: FastAPI runs sync ones in a thread pool, which
# cost more CPU per push than the whole route look-up.
async def _services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


_bearer = HTTPBearer(auto_error=False)


async def _require_key(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    if creds is None or not api_key_matches(request.app.state.api_key, creds.credentials):
        raise AuthError("missing or invalid API key (Authorization: Bearer <IMROUTE_API_KEY>)")


Svc = Annotated[Services, Depends(_services)]
Key = Depends(_require_key)


def create_app(settings: Settings, clock: Clock | None = None) -> FastAPI:
    """Build the app; Redis and gRPC channels are opened by its lifespan."""
    if settings.api_key is None:
        raise ConfigError("IMROUTE_API_KEY: required by the push service")
    api_key = settings.api_key.get_secret_value()
    clock = clock or SystemClock()
    keys = KeySchema(settings.redis_prefix)

    # Built here, not in the lifespan, so a bad IMROUTE_REDIS_URL stops the program with
    # a message before the server starts.
    redis_client = create_redis(settings.redis_url)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.aclosing(redis_client) as redis:
            clients = CoalescingGatewayClient(GrpcGatewayClients())
            registry = RedisRouteRegistry(redis, keys, clock)
            # The fleet's TTL is the gateways' to set; readers only read.
            fleet = CachedFleet(
                RedisGatewayFleet(redis, keys, clock, ttl_s=1), clock, settings.gateway_cache_s
            )
            pusher = P2PPusher(registry, fleet, clients, settings.deliver_timeout_s)
            app.state.services = Services(redis, registry, fleet, pusher)
            try:
                yield
            finally:
                await clients.close()

    app = FastAPI(
        title="imroute push service",
        version="0.1.0",
        lifespan=lifespan,
        description="Push messages to users connected to imroute socket gateways.",
    )
    app.state.api_key = api_key

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
    async def _registry_down(_: Request, exc: RegistryUnavailable) -> JSONResponse:
        log.warning("registry unavailable: %s", exc)
        return JSONResponse(
            {
                "error": "unavailable",
                "detail": "route registry (Redis) unavailable; nothing was sent",
            },
            status_code=503,
            headers={"Retry-After": "1"},
        )

    @app.post("/v1/push", dependencies=[Key], response_model=PushOut)
    async def push(body: PushIn, svc: Svc) -> JSONResponse:
        """Push one message to 1-1000 users wherever they are connected (P2P)."""
        message = Message(
            msg_id=new_id(),
            push_id=new_id(),
            msg_type=body.msg_type,
            sender=body.sender,
            content_json=encode_content(body.content),
            ts_ms=clock.now_ms(),
        )
        outcome = await svc.pusher.push(message, body.to)
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

    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)
    return app


def _describe_error(err: Any) -> dict[str, str]:
    if err.get("type") == "json_invalid":
        # FastAPI locates a JSON syntax error at ("body", <offset>); say so plainly.
        reason = (err.get("ctx") or {}).get("error", "")
        position = err["loc"][1] if len(err["loc"]) > 1 else "?"
        return {"field": "body", "message": f"invalid JSON at character {position}: {reason}"}
    return {"field": ".".join(str(p) for p in err["loc"]), "message": err["msg"]}


def encode_content(content: Any) -> bytes:
    """The content as compact UTF-8 JSON, at most MAX_CONTENT_BYTES."""
    try:
        data = json.dumps(content, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise InvalidInput("content", "must be JSON (NaN and Infinity are not)") from None
    encoded = data.encode()
    if len(encoded) > MAX_CONTENT_BYTES:
        raise PayloadTooLarge(
            "content", f"{len(encoded)} bytes once encoded; the limit is {MAX_CONTENT_BYTES}"
        )
    return encoded
