"""Broadcast and group multicast: accepted at once (202), run as background jobs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import JSONResponse

from push_service.content import new_message
from push_service.deps import Key, Services, Svc
from push_service.schemas import AcceptedOut, BroadcastIn, JobOut, MulticastIn
from router.fanout.broadcast import run_broadcast
from router.fanout.multicast import chunked, run_multicast
from router.fanout.publisher import BatchPublisher, PushCounters
from shared.models import Message

__all__ = ["router"]

router = APIRouter(dependencies=[Key])


def _message(svc: Services, body: BroadcastIn | MulticastIn) -> tuple[Message, int]:
    """The message (content encoded once) and its expiry in epoch ms (0: none)."""
    now = svc.clock.now_ms()
    message = new_message(body, now)
    return message, (now + body.ttl_s * 1000 if body.ttl_s else 0)


@router.post("/v1/broadcast", status_code=202, response_model=AcceptedOut)
async def broadcast(body: BroadcastIn, svc: Svc) -> JSONResponse:
    """Push to every directory user (or those with any of `tags_any`, or everyone online).

    The directory is paged 1000 uids at a time; each page is one batch that every
    gateway receives once and delivers to the users it holds.
    """
    message, expires_ms = _message(svc, body)
    audience = body.audience
    tags_any = audience.tags_any if audience else None
    online_only = bool(audience and audience.online)

    async def work(counters: PushCounters) -> None:
        publisher = BatchPublisher(svc.bus, message, expires_ms, counters)
        pages = (
            None
            if online_only
            else svc.directory.iter_pages(limit=svc.settings.batch_size, tags_any=tags_any)
        )
        await run_broadcast(pages, publisher)

    await svc.runner.submit(message.push_id, "broadcast", work)
    return JSONResponse({"push_id": message.push_id}, status_code=202)


@router.post("/v1/multicast", status_code=202, response_model=AcceptedOut)
async def multicast(body: MulticastIn, svc: Svc) -> JSONResponse:
    """Push to a list of users (or those with any of `tags_any`), batched per gateway group.

    Each group's batch is published when it holds `IMROUTE_BATCH_SIZE` users or when its
    oldest entry has waited `IMROUTE_FLUSH_TIMEOUT_S`; `"priority":"high"` never waits.
    """
    message, expires_ms = _message(svc, body)
    to = body.to
    tags_any = body.audience.tags_any if body.audience else None

    async def work(counters: PushCounters) -> None:
        publisher = BatchPublisher(svc.bus, message, expires_ms, counters)
        chunks: AsyncIterator[Sequence[str]] = (
            chunked(to) if to is not None else svc.directory.iter_pages(tags_any=tags_any)
        )
        await run_multicast(
            chunks,
            svc.registry,
            publisher,
            svc.clock,
            batch_size=svc.settings.batch_size,
            flush_timeout_s=svc.settings.flush_timeout_s,
            high_priority=body.priority == "high",
        )

    await svc.runner.submit(message.push_id, "multicast", work)
    return JSONResponse({"push_id": message.push_id}, status_code=202)


@router.get("/v1/pushes/{push_id}", response_model=JobOut)
async def push_status(
    push_id: Annotated[str, Path(min_length=1, max_length=64)], svc: Svc
) -> JSONResponse:
    """The state of a broadcast or multicast job."""
    job = await svc.jobs.get(push_id)
    if job is None:
        return JSONResponse(
            {"error": "not_found", "detail": f"no push job {push_id!r}"}, status_code=404
        )
    return JSONResponse(job.as_dict())
