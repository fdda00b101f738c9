"""POST /v1/push: one message to 1-1000 users, delivered now where they are connected
(canonical bodies are answered before FastAPI, by push_service.fast_push, through the
same service method); POST /v1/push/batch: up to 1000 such messages in one call.

A batch's messages are each checked on their own, so one bad message fails only itself,
and its valid ones pushed together (`Pushes.push`): one log-and-inbox write for all of
them, one route look-up for all their recipients, each gateway's deliveries in as few
calls as its lane makes of them, one receipt write; that is what makes a batch cheaper
per message than as many single pushes. A message with `wait_ack_ms` is refused (422):
a batch is for pushing at volume, and one message waiting would hold every other answer
back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from push_service.errors import describe_errors, handler_for
from push_service.fast_push import may_hold_surrogates, push_answer, quick_push
from push_service.idempotency.http import PartlyFailed
from push_service.routes.deps import IdempotentOnce, PushesSvc, PushKey
from push_service.schemas import MAX_BATCH, PushBatchOut, PushIn, PushOut
from push_service.services import Pushes
from shared.errors import ImrouteError

__all__ = ["router"]

router = APIRouter()


@router.post("/v1/push", dependencies=[PushKey], response_model=PushOut)
async def push(body: PushIn, pushes: PushesSvc, once: IdempotentOnce) -> Response:
    """Push one message to 1-1000 users wherever they are connected (P2P)."""
    return await once(lambda seed: _push(body, pushes, seed), (body.wait_ack_ms or 0) / 1000)


async def _push(body: PushIn, pushes: PushesSvc, seed: str | None) -> JSONResponse:
    return JSONResponse(push_answer(await pushes.push_one(body, seed=seed)))


class PushBatchIn(BaseModel):
    """Up to 1000 POST /v1/push bodies; each is checked on its own."""

    model_config = ConfigDict(extra="forbid")

    messages: list[Any] = Field(
        min_length=1,
        max_length=MAX_BATCH,
        description="each a POST /v1/push body, without wait_ack_ms; one bad message "
        "fails only itself",
        json_schema_extra={"items": {"$ref": "#/components/schemas/PushIn"}},
    )


@router.post("/v1/push/batch", dependencies=[PushKey], response_model=PushBatchOut)
async def push_batch(
    request: Request, body: PushBatchIn, pushes: PushesSvc, once: IdempotentOnce
) -> Response:
    """Push up to 1000 messages, each to 1-1000 users, in one call: one answer per
    message, in order, each with the status and body POST /v1/push would give it."""
    return await once(lambda seed: _push_batch(request, body.messages, pushes, seed))


async def _push_batch(
    request: Request, messages: list[Any], pushes: Pushes, seed: str | None
) -> JSONResponse:
    # FastAPI read (and cached) the body to bind it; this reads no byte again.
    checked = check_messages(messages, quick=not may_hold_surrogates(await request.body()))
    valid = [(i, c) for i, c in enumerate(checked) if isinstance(c, PushIn)]
    outcomes = await pushes.push([c for _, c in valid], batch=True, seed=seed)
    results: list[dict[str, Any]] = [{} for _ in checked]
    for i, item in enumerate(checked):
        if isinstance(item, Invalid):
            prefix = ("body", "messages", i)
            detail = (
                describe_errors(item.errors, prefix)
                if item.errors
                else [{"field": f"body.messages.{i}.{item.field}", "message": item.message}]
            )
            results[i] = {"index": i, "status": 422, "error": "invalid_request", "detail": detail}
    for (i, _), outcome in zip(valid, outcomes, strict=True):
        if isinstance(outcome, ImrouteError):
            answer = await _rendered(request, outcome)
            if isinstance(answer.get("detail"), list):  # a field of this message
                for d in answer["detail"]:
                    d["field"] = f"body.messages.{i}.{d['field']}"
            results[i] = {"index": i, **answer}
        else:
            results[i] = {"index": i, "status": 200, **push_answer(outcome)}
    failed = any(r["status"] >= 500 for r in results)
    return (PartlyFailed if failed else JSONResponse)({"results": results})


@dataclass(frozen=True, slots=True)
class Invalid:
    """A message that failed its checks: pydantic's errors, or one field and why."""

    errors: Sequence[Any] = ()
    field: str = ""
    message: str = ""


def check_messages(messages: Sequence[Any], quick: bool = True) -> list[PushIn | Invalid]:
    """Each message as a PushIn (checked as POST /v1/push checks its body), or why not.
    `quick`: the hand checks may vouch for canonical ones (not when the raw body may
    hold a lone surrogate, which json.loads lets through)."""
    checked: list[PushIn | Invalid] = []
    for message in messages:
        push = quick_push(message) if quick else None
        if push is None:
            try:
                push = PushIn.model_validate(message)
            except ValidationError as exc:
                checked.append(Invalid(exc.errors(include_url=False)))
                continue
        if push.wait_ack_ms is not None:
            checked.append(
                Invalid(field="wait_ack_ms", message="not in a batch: use POST /v1/push")
            )
            continue
        checked.append(push)
    return checked


async def _rendered(request: Request, exc: ImrouteError) -> dict[str, Any]:
    """The status and JSON body the app's error handlers give `exc` on POST /v1/push."""
    handler = handler_for(request.app.exception_handlers, exc)
    if handler is None:
        return {"status": 500, "error": "internal_error", "detail": str(exc)}
    response: Response = await handler(request, exc)
    return {"status": response.status_code, **json.loads(bytes(response.body))}
