"""POST /v1/push: one message to 1-1000 users, delivered now where they are connected."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from push_service.routes.deps import IdempotentOnce, PushesSvc, PushKey
from push_service.schemas import PushIn, PushOut

__all__ = ["router"]

router = APIRouter()


@router.post("/v1/push", dependencies=[PushKey], response_model=PushOut)
async def push(body: PushIn, pushes: PushesSvc, once: IdempotentOnce) -> Response:
    """Push one message to 1-1000 users wherever they are connected (P2P)."""
    return await once(lambda: _push(body, pushes))


async def _push(body: PushIn, pushes: PushesSvc) -> JSONResponse:
    pushed = await pushes.push(body)
    message, outcome = pushed.message, pushed.outcome
    # Built directly: validating our own output through PushOut again is pure cost on
    # the hottest endpoint. PushOut still documents it in the OpenAPI schema.
    answer: dict[str, Any] = {
        "push_id": message.push_id,
        "msg_id": message.msg_id,
        "delivered": outcome.delivered,
        "offline": outcome.offline,
        "failed": outcome.failed,
        "queued": outcome.queued,
        "errors": [{"gateway_id": e.gateway_id, "error": e.error} for e in outcome.errors],
    }
    if pushed.acked is not None:
        answer["acked"] = pushed.acked
        answer["unacked"] = pushed.unacked
    return JSONResponse(answer)
