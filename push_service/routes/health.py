"""GET /healthz (no key) and GET /metrics (Prometheus, not in the OpenAPI schema)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from push_service.routes.deps import HealthSvc

__all__ = ["router"]

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
async def metrics(health: HealthSvc) -> Response:
    """Prometheus metrics: publishing (and hedging) per topic."""
    return Response(await health.scrape(), media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz")
async def healthz(health: HealthSvc) -> JSONResponse:
    """200 when Redis answers (a Redis Cluster: and serves every slot), else 503. Needs
    no key."""
    if await health.redis_answers():
        return JSONResponse({"status": "ok"})
    return JSONResponse({"status": "unavailable", "detail": "redis"}, status_code=503)
