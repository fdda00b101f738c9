"""The user directory over HTTP: bulk upsert and delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response
from fastapi.responses import JSONResponse

from push_service.deps import Key, Svc
from push_service.schemas import UpsertedOut, UsersIn
from router.directory.sql import UserRecord

__all__ = ["router"]

router = APIRouter(dependencies=[Key])


@router.put("/v1/users", response_model=UpsertedOut)
async def upsert_users(body: UsersIn, svc: Svc) -> UpsertedOut:
    """Create or update up to 10,000 users; their tags are replaced."""
    records = [UserRecord.parse(u.uid, u.tags) for u in body.users]
    return UpsertedOut(upserted=await svc.directory.upsert(records))


@router.delete("/v1/users/{uid}", status_code=204, response_class=Response)
async def delete_user(
    uid: Annotated[str, Path(min_length=1, max_length=128)], svc: Svc
) -> Response:
    """Remove a user from the directory."""
    if await svc.directory.delete(uid):
        return Response(status_code=204)
    return JSONResponse({"error": "not_found", "detail": f"no user {uid!r}"}, status_code=404)
