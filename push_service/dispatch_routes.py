"""GET /v1/dispatch: which gateway a client should open its WebSocket on."""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from push_service.deps import Key, Svc
from push_service.schemas import DispatchOut
from router.balancing import NoEligibleGateway
from router.fleet.drain import RedisDrainRequests
from shared.auth import verify_token
from shared.keys import KeySchema

__all__ = ["router"]

router = APIRouter()

_bearer = HTTPBearer(auto_error=False)


@router.get("/v1/dispatch", response_model=DispatchOut)
async def dispatch(
    svc: Svc,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    zone: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
) -> JSONResponse:
    """The gateway to connect to, for the client whose JWT this is (the same token it
    will send to /ws). `zone` (optional) is preferred by the zone_affinity rule."""
    secret = svc.settings.secret
    if secret is None:
        return JSONResponse(
            {"error": "unavailable", "detail": "dispatch needs IMROUTE_SECRET to check tokens"},
            status_code=503,
        )
    uid = verify_token(
        secret.get_secret_value(), creds.credentials if creds else None, svc.clock
    )  # AuthError: 401, by the app's handler
    try:
        chosen = await svc.dispatcher.choose(uid, zone)
    except NoEligibleGateway as exc:
        return JSONResponse(
            {"error": "unavailable", "detail": exc.reason},
            status_code=503,
            # The fleet is read again after IMROUTE_GATEWAY_CACHE_S: try after that.
            headers={"Retry-After": str(max(1, math.ceil(svc.settings.gateway_cache_s)))},
        )
    return JSONResponse(
        {"ws_url": chosen.ws_url, "gateway_id": chosen.gateway_id, "group_id": chosen.group_id}
    )


@router.post("/v1/gateways/{gateway_id}/drain", dependencies=[Key], status_code=202)
async def drain(
    gateway_id: Annotated[str, Path(min_length=1, max_length=64)], svc: Svc
) -> JSONResponse:
    """Ask a live gateway to drain: it stops taking clients, tells each to reconnect
    elsewhere and closes them (4503) over IMROUTE_DRAIN_WINDOW_S; dispatch stops
    choosing it at once. The gateway sees the request at its next heartbeat."""
    svc.fleet.invalidate()
    if all(g.gateway_id != gateway_id for g in await svc.fleet.live()):
        return JSONResponse(
            {"error": "not_found", "detail": f"no live gateway {gateway_id!r}"}, status_code=404
        )
    await RedisDrainRequests(svc.redis, KeySchema(svc.settings.redis_prefix)).request(gateway_id)
    return JSONResponse({"gateway_id": gateway_id, "draining": True}, status_code=202)
