"""Users: where one is connected (push key), and the directory's bulk upsert and delete
(admin key)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response
from pydantic import AfterValidator

from push_service.routes.deps import AdminKey, PushKey, UsersSvc
from push_service.schemas import RouteOut, UpsertedOut, UserRouteOut, UsersIn, check_uid_value
from shared.uids import MAX_UID_LEN

__all__ = ["router"]

router = APIRouter()

Uid = Annotated[str, Path(min_length=1, max_length=MAX_UID_LEN), AfterValidator(check_uid_value)]


@router.get("/v1/users/{uid}/route", dependencies=[PushKey], response_model=UserRouteOut)
async def user_route(uid: Uid, users: UsersSvc) -> UserRouteOut:
    """Where a user is connected right now (one entry per live connection)."""
    routes = await users.routes(uid)
    return UserRouteOut(
        uid=uid,
        online=bool(routes),
        routes=[
            RouteOut(gateway_id=r.gateway_id, group_id=r.group_id, ip=r.ip, port=r.port)
            for r in routes
        ],
    )


@router.put("/v1/users", dependencies=[AdminKey], response_model=UpsertedOut)
async def upsert_users(body: UsersIn, users: UsersSvc) -> UpsertedOut:
    """Create or update up to 10,000 users; their tags are replaced (admin key)."""
    return UpsertedOut(upserted=await users.upsert(body.users))


@router.delete("/v1/users/{uid}", dependencies=[AdminKey], status_code=204, response_class=Response)
async def delete_user(uid: Uid, users: UsersSvc) -> Response:
    """Remove a user from the directory (admin key)."""
    await users.delete(uid)
    return Response(status_code=204)
