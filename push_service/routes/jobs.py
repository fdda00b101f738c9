"""GET /v1/pushes/{push_id}: a push's status and receipt (any mode), and its recipients
by state."""

from __future__ import annotations

import contextlib
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse
from pydantic import AfterValidator

from push_service.errors import NotFound
from push_service.routes.deps import FanOutSvc, PushKey, ReceiptsSvc
from push_service.schemas import JobOut, P2PStatusOut, RecipientsOut, check_uid_value
from push_service.services.receipts import MAX_PAGE
from shared.uids import MAX_UID_LEN

__all__ = ["router"]

router = APIRouter(dependencies=[PushKey])

PushId = Annotated[str, Path(min_length=1, max_length=64)]


def _cursor(cursor: str | None) -> str | None:
    return None if cursor is None else check_uid_value(cursor)


@router.get("/v1/pushes/{push_id}", response_model=JobOut | P2PStatusOut)
async def push_status(push_id: PushId, fanout: FanOutSvc, receipts: ReceiptsSvc) -> JSONResponse:
    """A broadcast or multicast job's state, or a P2P push's; with the receipt's counts.
    404 when neither a job record (kept 7 days after the job) nor a receipt (kept
    IMROUTE_RECEIPTS_TTL_S) of the push is left: an unknown or expired id, or a P2P push
    while receipts are off."""
    try:
        job = await fanout.status(push_id)
    except NotFound:
        job = None
    return JSONResponse(await receipts.status(push_id, job))


@router.get("/v1/pushes/{push_id}/recipients", response_model=RecipientsOut)
async def push_recipients(
    push_id: PushId,
    fanout: FanOutSvc,
    receipts: ReceiptsSvc,
    state: Annotated[Literal["acked", "unacked", "queued"], Query()],
    # the last uid of the page before (the one rule checks its length, and counts it)
    cursor: Annotated[
        str | None,
        Query(json_schema_extra={"minLength": 1, "maxLength": MAX_UID_LEN}),
        AfterValidator(_cursor),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
) -> JSONResponse:
    """The recipients in a state, in uid order, a page at a time: 404 when the push has
    no receipt (a job record alone is not enough), 409 for a push with more than
    IMROUTE_RECEIPTS_MAX_RECIPIENTS recipients (counts only)."""
    job = None
    if state == "queued":  # a multicast's queued end with the recovery window
        with contextlib.suppress(NotFound):
            job = await fanout.status(push_id)
    return JSONResponse(await receipts.recipients(push_id, state, cursor, limit, job))
