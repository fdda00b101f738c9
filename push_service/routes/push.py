"""POST /v1/push: one message to 1-1000 users, delivered now where they are connected."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from push_service.fast_push import push_answer
from push_service.routes.deps import IdempotentOnce, PushesSvc, PushKey
from push_service.schemas import PushIn, PushOut

__all__ = ["router"]

router = APIRouter()


@router.post("/v1/push", dependencies=[PushKey], response_model=PushOut)
async def push(body: PushIn, pushes: PushesSvc, once: IdempotentOnce) -> Response:
    """Push one message to 1-1000 users wherever they are connected (P2P)."""
    return await once(lambda: _push(body, pushes))


async def _push(body: PushIn, pushes: PushesSvc) -> JSONResponse:
    return JSONResponse(push_answer(await pushes.push(body)))
