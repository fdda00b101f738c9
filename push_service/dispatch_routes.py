"""GET /v1/dispatch: which gateway a client should open its WebSocket on."""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from push_service.deps import Svc
from push_service.schemas import DispatchOut
from router.balancing import NoEligibleGateway
from shared.auth import verify_token

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

