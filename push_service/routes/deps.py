"""What handlers depend on: the API-key checks (one per scope), and the one service each
handler calls."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from push_service.admission import ApiKeys, Scope, authorize
from push_service.errors import Forbidden
from push_service.idempotency.base import HEADER, parse_key
from push_service.idempotency.http import Once
from push_service.services import (
    Dispatch,
    FanOut,
    Fleet,
    Health,
    Overview,
    Pushes,
    ReceiptsView,
    Services,
    Users,
)
from shared.errors import AuthError

__all__ = [
    "KEY_SCHEMES",
    "AdminKey",
    "DispatchSvc",
    "FanOutSvc",
    "FleetSvc",
    "HealthSvc",
    "IdempotentOnce",
    "OverviewSvc",
    "PushKey",
    "PushesSvc",
    "UsersSvc",
    "client_bearer",
]

T = TypeVar("T")

# One security scheme per credential, so the OpenAPI document says which each needs.
_push_bearer = HTTPBearer(scheme_name="PushKey", description="IMROUTE_API_KEY", auto_error=False)
_admin_bearer = HTTPBearer(
    scheme_name="AdminKey",
    description="IMROUTE_ADMIN_API_KEY (IMROUTE_API_KEY when no admin key is set)",
    auto_error=False,
)
client_bearer = HTTPBearer(
    scheme_name="ClientToken", description="the client's JWT", auto_error=False
)


def _check(request: Request, creds: HTTPAuthorizationCredentials | None, needed: Scope) -> None:
    # The ASGI gate (push_service.admission.Admission) has already refused such a request before its
    # body was read; this is the second line, and what puts the scheme in the schema.
    keys: ApiKeys = request.app.state.keys
    denial = authorize(keys, creds.credentials if creds else None, needed)
    if denial is None:
        return
    if denial.status == 403:
        raise Forbidden(denial.detail, denial.www_authenticate)
    raise AuthError(denial.detail)


async def _require_push(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_push_bearer)],
) -> None:
    _check(request, creds, Scope.PUSH)


async def _require_admin(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_admin_bearer)],
) -> None:
    _check(request, creds, Scope.ADMIN)


# How the gate finds which scope an operation needs: the scheme its schema names.
KEY_SCHEMES: dict[str, Scope] = {"PushKey": Scope.PUSH, "AdminKey": Scope.ADMIN}


def _services(request: Request) -> Services:
    services: Services = request.app.state.services  # put there by the lifespan
    return services


def _service(pick: Callable[[Services], T]) -> Callable[[Request], Awaitable[T]]:
    """The dependency that hands a handler the service `pick` chooses."""

    # Async on purpose: FastAPI runs sync dependencies in a thread pool, which costs more
    # CPU per push than the whole route look-up.
    async def service(request: Request) -> T:
        return pick(_services(request))

    return service


PushKey = Depends(_require_push)
AdminKey = Depends(_require_admin)
PushesSvc = Annotated[Pushes, Depends(_service(lambda s: s.pushes))]
DispatchSvc = Annotated[Dispatch, Depends(_service(lambda s: s.dispatch))]
FleetSvc = Annotated[Fleet, Depends(_service(lambda s: s.fleet))]
OverviewSvc = Annotated[Overview, Depends(_service(lambda s: s.overview))]
FanOutSvc = Annotated[FanOut, Depends(_service(lambda s: s.fanout))]
UsersSvc = Annotated[Users, Depends(_service(lambda s: s.users))]
HealthSvc = Annotated[Health, Depends(_service(lambda s: s.health))]
ReceiptsSvc = Annotated[ReceiptsView, Depends(_service(lambda s: s.receipts))]


# --- idempotency: the Idempotency-Key of the three push endpoints ---
async def _once(
    request: Request,
    key: Annotated[
        str | None,
        Header(
            alias=HEADER,
            description="1-255 printable characters; the same key and body within "
            "IMROUTE_IDEMPOTENCY_TTL_S get the first answer again, and nothing is re-sent",
        ),
    ] = None,
) -> Once:
    return Once(_services(request).idempotency, request, None if key is None else parse_key(key))


IdempotentOnce = Annotated[Once, Depends(_once)]
