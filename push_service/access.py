"""Who may call what: the two API keys, their scopes, and the verdict on a presented one.

Pure: the ASGI gate (`push_service.gate`) and the handlers' dependencies
(`push_service.routes.deps`) both decide with `authorize`, so the two checks cannot
disagree. Keys are compared in constant time (`shared.auth.api_key_matches`).

- `PUSH` (IMROUTE_API_KEY): pushes, broadcast, multicast, jobs, routes, the fleet list.
- `ADMIN` (IMROUTE_ADMIN_API_KEY): drains and user-directory writes. Without an admin
  key the push key holds both scopes. With one, each key holds only its own scope: the
  admin key cannot push (least privilege; an operator's key leaks less than a sender's).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shared.auth import api_key_matches
from shared.settings import PushSettings

__all__ = ["ApiKeys", "Denial", "Scope", "authorize", "bearer_token", "presented", "route_path"]


class Scope(enum.Enum):
    PUSH = "push"
    ADMIN = "admin"


_VARIABLE = {Scope.PUSH: "IMROUTE_API_KEY", Scope.ADMIN: "IMROUTE_ADMIN_API_KEY"}


@dataclass(frozen=True, slots=True)
class ApiKeys:
    """The push key, and the admin key when one is set."""

    push: str
    admin: str | None = None

    @classmethod
    def from_settings(cls, settings: PushSettings) -> ApiKeys:
        """The keys of `settings`; the caller has checked that IMROUTE_API_KEY is set."""
        assert settings.api_key is not None
        admin = settings.admin_api_key
        return cls(settings.api_key.get_secret_value(), admin.get_secret_value() if admin else None)

    def key_for(self, scope: Scope) -> str:
        """The key that holds `scope`."""
        if scope is Scope.ADMIN and self.admin is not None:
            return self.admin
        return self.push

    def variable_for(self, scope: Scope) -> str:
        """The variable that holds the key for `scope`, as callers are told it."""
        return _VARIABLE[Scope.ADMIN if scope is Scope.ADMIN and self.admin else Scope.PUSH]


@dataclass(frozen=True, slots=True)
class Denial:
    """Why a request is refused: 401 (no valid key) or 403 (a valid key, another scope)."""

    status: int
    error: str
    detail: str
    www_authenticate: str


def bearer_token(authorization: str | None) -> str | None:
    """The credential of an `Authorization: Bearer <token>` header value, else None."""
    if not authorization:
        return None
    # Split as FastAPI's HTTPBearer splits it, so the gate and the handlers' own check
    # read the same credential.
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def presented(headers: Iterable[tuple[bytes, bytes]]) -> tuple[str | None, bool]:
    """From a request's raw (ASGI) headers: the Bearer credential it presents, and
    whether it announced a body (which a refusal then closes the connection on)."""
    authorization = None
    has_body = False
    for name, value in headers:
        if name == b"authorization" and authorization is None:
            authorization = value.decode("latin-1")
        elif (name == b"content-length" and value not in (b"0", b"")) or (
            name == b"transfer-encoding"
        ):
            has_body = True
    return bearer_token(authorization), has_body


def route_path(scope: Mapping[str, Any]) -> str:
    """The path a request names within the app: its (ASGI) path without the `root_path`
    the app is served under (uvicorn's --root-path, or a mount), as Starlette's router
    takes it; so every gate judges the path the route will serve."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
        return path[len(root) :]
    return path


def authorize(keys: ApiKeys, presented: str | None, needed: Scope) -> Denial | None:
    """None when `presented` (a bearer credential, see `bearer_token`) is a key with
    scope `needed`; else why not."""
    if presented is not None:
        if api_key_matches(keys.key_for(needed), presented):
            return None
        other = Scope.PUSH if needed is Scope.ADMIN else Scope.ADMIN
        if keys.admin is not None and api_key_matches(keys.key_for(other), presented):
            return Denial(
                403,
                "forbidden",
                f"this endpoint needs the {needed.value} scope "
                f"(Authorization: Bearer <{keys.variable_for(needed)}>); the key presented "
                f"has the {other.value} scope only",
                f'Bearer error="insufficient_scope", scope="{needed.value}"',
            )
    what = "missing" if presented is None else "invalid"
    return Denial(
        401,
        "unauthorized",
        f"{what} API key (Authorization: Bearer <{keys.variable_for(needed)}>)",
        "Bearer",
    )
