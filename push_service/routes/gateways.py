"""The fleet: GET /v1/gateways, and POST /v1/gateways/{id}/drain."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse

from push_service.routes.deps import AdminKey, FleetSvc, PushKey
from push_service.schemas import GatewayOut, GatewaysOut

__all__ = ["router"]

router = APIRouter()


@router.get("/v1/gateways", dependencies=[PushKey], response_model=GatewaysOut)
async def gateways(fleet: FleetSvc) -> GatewaysOut:
    """The live gateways, as their heartbeats announce them."""
    return GatewaysOut(
        gateways=[
            GatewayOut(
                gateway_id=g.gateway_id,
                group_id=g.group_id,
                ws_url=g.ws_url,
                grpc_address=g.grpc_address,
                connections=g.connections,
                max_connections=g.max_connections,
                zone=g.zone,
                draining=g.draining,
                started_ms=g.started_ms,
            )
            for g in await fleet.live()
        ]
    )


@router.post("/v1/gateways/{gateway_id}/drain", dependencies=[AdminKey], status_code=202)
async def drain(
    gateway_id: Annotated[str, Path(min_length=1, max_length=64)],
    fleet: FleetSvc,
    force: Annotated[bool, Query()] = False,
) -> JSONResponse:
    """Ask a live gateway to drain (admin key): it stops taking clients, tells each to
    reconnect elsewhere and closes them (4503) over IMROUTE_DRAIN_WINDOW_S; dispatch
    stops choosing it at once. The gateway sees the request at its next heartbeat.

    409 when it is the last gateway of its group that is not draining (nor asked to),
    unless `force=true`."""
    await fleet.drain(gateway_id, force=force)
    return JSONResponse({"gateway_id": gateway_id, "draining": True}, status_code=202)
