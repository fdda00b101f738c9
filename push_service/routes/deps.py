"""What handlers depend on: the API-key check, and the one service each handler calls."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from push_service.services import Dispatch, FanOut, Fleet, Health, Pushes, Services, Users
from shared.auth import api_key_matches
from shared.errors import AuthError

__all__ = [
    "DispatchSvc",
    "FanOutSvc",
    "FleetSvc",
    "HealthSvc",
    "Key",
    "PushesSvc",
    "UsersSvc",
    "bearer",
]

bearer = HTTPBearer(auto_error=False)


async def _require_key(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    if creds is None or not api_key_matches(request.app.state.api_key, creds.credentials):
        raise AuthError("missing or invalid API key (Authorization: Bearer <IMROUTE_API_KEY>)")


def _services(request: Request) -> Services:
    services: Services = request.app.state.services  # put there by the lifespan
    return services


# Dependencies are async on purpose: FastAPI runs sync ones in a thread pool, which
# cost more CPU per push than the whole route look-up.
async def _pushes(request: Request) -> Pushes:
    return _services(request).pushes


async def _dispatch(request: Request) -> Dispatch:
    return _services(request).dispatch


async def _fleet(request: Request) -> Fleet:
    return _services(request).fleet


async def _fanout(request: Request) -> FanOut:
    return _services(request).fanout


async def _users(request: Request) -> Users:
    return _services(request).users


async def _health(request: Request) -> Health:
    return _services(request).health


Key = Depends(_require_key)
PushesSvc = Annotated[Pushes, Depends(_pushes)]
DispatchSvc = Annotated[Dispatch, Depends(_dispatch)]
FleetSvc = Annotated[Fleet, Depends(_fleet)]
FanOutSvc = Annotated[FanOut, Depends(_fanout)]
UsersSvc = Annotated[Users, Depends(_users)]
HealthSvc = Annotated[Health, Depends(_health)]
