"""Users: where one is connected (push key), and the directory's bulk upsert and delete
(admin key)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response
from pydantic import AfterValidator
from starlette.convertors import Convertor, register_url_convertor

from push_service.routes.deps import AdminKey, PushKey, UsersSvc
from push_service.schemas import RouteOut, UpsertedOut, UserRouteOut, UsersIn, check_uid_value
from shared.uids import MAX_UID_LEN

__all__ = ["router"]

router = APIRouter()


class _AnyText(Convertor[str]):
    """A path parameter of any text: "/" (a uid may hold one, sent as %2F or as is) and
    the control characters the rule refuses, so they get its 422 (and are counted)
    rather than a 404. ".../route" is the route's: GET /v1/users/a/route/route is the
    uid "a/route"."""

    regex = r"[\s\S]*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("uid", _AnyText())

# The one rule checks the length too, so a uid too long is counted like every refused
# uid; the schema shows the bounds.
Uid = Annotated[
    str,
    Path(json_schema_extra={"minLength": 1, "maxLength": MAX_UID_LEN}),
    AfterValidator(check_uid_value),
]


@router.get("/v1/users/{uid:uid}/route", dependencies=[PushKey], response_model=UserRouteOut)
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


@router.delete(
    "/v1/users/{uid:uid}", dependencies=[AdminKey], status_code=204, response_class=Response
)
async def delete_user(uid: Uid, users: UsersSvc) -> Response:
    """Remove a user from the directory (admin key)."""
    await users.delete(uid)
    return Response(status_code=204)
