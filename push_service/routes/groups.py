"""Broadcast and group multicast: accepted at once (202), run as background jobs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from push_service.routes.deps import FanOutSvc, IdempotentOnce, PushKey
from push_service.schemas import AcceptedOut, BroadcastIn, MulticastIn

__all__ = ["router"]

router = APIRouter(dependencies=[PushKey])


@router.post("/v1/broadcast", status_code=202, response_model=AcceptedOut)
async def broadcast(body: BroadcastIn, fanout: FanOutSvc, once: IdempotentOnce) -> Response:
    """Push to every directory user (or those with any of `tags_any`, or everyone online).

    The directory is paged 1000 uids at a time; each page is one batch that every
    gateway receives once and delivers to the users it holds.
    """
    return await once(_accepted(lambda seed: fanout.broadcast(body, seed=seed)))


@router.post("/v1/multicast", status_code=202, response_model=AcceptedOut)
async def multicast(body: MulticastIn, fanout: FanOutSvc, once: IdempotentOnce) -> Response:
    """Push to a list of users (or those with any of `tags_any`), batched per gateway group.

    Each group's batch is published when it holds `IMROUTE_BATCH_SIZE` users or when its
    oldest entry has waited `IMROUTE_FLUSH_TIMEOUT_S`; `"priority":"high"` never waits.
    """
    return await once(_accepted(lambda seed: fanout.multicast(body, seed=seed)))


def _accepted(
    start: Callable[[str | None], Awaitable[str]],
) -> Callable[[str | None], Awaitable[Response]]:
    """The 202 of a job `start` starts, started only when `once` runs it (with its id
    seed)."""

    async def accept(seed: str | None) -> Response:
        return JSONResponse({"push_id": await start(seed)}, status_code=202)

    return accept
