"""GET /v1/admin/overview (admin key): everything the dashboard shows, in one read."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from push_service.admin_schemas import OverviewOut
from push_service.routes.deps import AdminKey, OverviewSvc

__all__ = ["router"]

router = APIRouter()


@router.get("/v1/admin/overview", dependencies=[AdminKey], response_model=OverviewOut)
async def overview(view: OverviewSvc) -> JSONResponse:
    """The fleet by group and gateway (with circuits, heartbeats and rates), the last ten
    minutes of the fleet's rates and delivery latency, and the latest broadcasts and
    multicasts with their progress. What /dashboard polls."""
    return JSONResponse(await view.read())
