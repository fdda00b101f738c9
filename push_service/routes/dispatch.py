"""GET /v1/dispatch: which gateway a client should open its WebSocket on."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials

from push_service.routes.deps import DispatchSvc, client_bearer
from push_service.schemas import DispatchOut

__all__ = ["router"]

router = APIRouter()


@router.get("/v1/dispatch", response_model=DispatchOut)
async def dispatch(
    dispatch: DispatchSvc,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(client_bearer)],
    zone: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
    avoid: Annotated[list[str] | None, Query()] = None,
) -> JSONResponse:
    """The gateway to connect to, for the client whose JWT this is (the same token it
    will send to /ws), sent as `Authorization: Bearer <token>` (not `?token=`, which only
    /ws takes). `zone` (optional) is preferred by the zone_affinity rule; `avoid`
    (repeatable, or comma-separated) names gateways the client could not connect to.
    401 for a missing or invalid token; 422 for a malformed `avoid`, or a token too long
    to connect and resume with; 503 when no gateway can take the client (with
    `Retry-After`), or when the push service has no IMROUTE_SECRET to check tokens with."""
    chosen = await dispatch.choose(creds.credentials if creds else None, zone, avoid or ())
    return JSONResponse(
        {"ws_url": chosen.ws_url, "gateway_id": chosen.gateway_id, "group_id": chosen.group_id}
    )
