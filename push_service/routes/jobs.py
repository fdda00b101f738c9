"""GET /v1/pushes/{push_id}: the status of a broadcast or multicast job."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import JSONResponse

from push_service.routes.deps import FanOutSvc, PushKey
from push_service.schemas import JobOut

__all__ = ["router"]

router = APIRouter(dependencies=[PushKey])


@router.get("/v1/pushes/{push_id}", response_model=JobOut)
async def push_status(
    push_id: Annotated[str, Path(min_length=1, max_length=64)], fanout: FanOutSvc
) -> JSONResponse:
    """The state of a broadcast or multicast job."""
    return JSONResponse((await fanout.status(push_id)).as_dict())
