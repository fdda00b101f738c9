"""Who may call what: the two API keys, their scopes, the verdict on a presented one, and
the ASGI gate that gives it before any body byte is read.

The gate (`KeyGate`) and the handlers' dependencies (`push_service.routes.deps`) both
decide with `authorize`, so the two checks cannot disagree. Keys are compared in
constant time (`shared.auth.api_key_matches`).

- `PUSH` (IMROUTE_API_KEY): pushes, broadcast, multicast, jobs, routes, the fleet list.
- `ADMIN` (IMROUTE_ADMIN_API_KEY): drains and user-directory writes. Without an admin
  key the push key holds both scopes. With one, each key holds only its own scope: the
  admin key cannot push (least privilege; an operator's key leaks less than a sender's).

**The gate.** FastAPI resolves a handler's dependencies only after it has read and
parsed the body, so a key checked there comes too late: an unauthenticated 160 MiB
multicast was read and parsed (4 GB of Python objects) before its 401. The gate runs
first, in front of `BodyLimit`: a request to a path that needs a key and does not present
it (or presents the other scope's) is answered 401 (or 403) from its headers alone, and
the large body limits of `/v1/multicast` and `/v1/users` are reached only with a valid
key.

Which scope each route needs (`AccessRules`) is read from the app's OpenAPI document:
the security scheme each operation names, which the handler's own key check
(`routes.deps.PushKey` / `AdminKey`, kept as a second line) puts there. So the gate, the
handlers and the published schema cannot disagree.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Receive, Send
from starlette.types import Scope as AsgiScope

from push_service.errors import send_error
from shared.auth import api_key_matches
from shared.settings import PushSettings

__all__ = [
    "AccessRules",
    "ApiKeys",
    "Denial",
    "KeyGate",
    "Scope",
    "authorize",
    "bearer_token",
    "presented",
    "route_path",
]


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


_RANK = {None: 0, Scope.PUSH: 1, Scope.ADMIN: 2}


@dataclass(slots=True)
class _PathRule:
    by_method: dict[str, Scope | None] = field(default_factory=dict)

    def scope_for(self, method: str) -> Scope | None:
        if method in self.by_method:
            return self.by_method[method]
        # The path exists but not for this method (a 405 to come): the strictest of the
        # path's scopes, so probing methods tells an unauthenticated caller nothing.
        return max(self.by_method.values(), key=_RANK.__getitem__, default=None)


_Pattern = tuple[re.Pattern[str], _PathRule]


class AccessRules:
    """The scope each (method, path) needs; None for public routes and unknown paths.

    Where several paths match, the strictest scope among them is needed, so the gate is
    never laxer than whichever route the router picks."""

    def __init__(self, static: dict[str, list[_PathRule]], patterns: list[_Pattern]) -> None:
        self._static = static  # the hot paths, found in one look-up
        self._patterns = patterns

    @classmethod
    def from_openapi(
        cls,
        schema: Mapping[str, Any],
        schemes: Mapping[str, Scope],
        regexes: Mapping[str, re.Pattern[str]] | None = None,
    ) -> AccessRules:
        """Rules from an OpenAPI document: each operation needs the scope of the security
        scheme it names (`schemes`: scheme name -> scope). Routes left out of the schema
        are public: they must not need a key. `regexes`: the router's own pattern of a
        path, by its OpenAPI form, which does not say that a parameter such as
        `{uid:uid}` spans segments; a path without one takes each parameter as one
        segment."""
        regexes = regexes or {}
        static: dict[str, _PathRule] = {}
        patterns: list[_Pattern] = []
        for path, operations in schema.get("paths", {}).items():
            rule = _PathRule()
            for method, operation in operations.items():
                needed = [
                    schemes[name]
                    for requirement in operation.get("security", ())
                    for name in requirement
                    if name in schemes
                ]
                rule.by_method[method.upper()] = max(needed, key=_RANK.__getitem__, default=None)
            if "{" in path:
                patterns.append((regexes.get(path) or _template_regex(path), rule))
            else:
                static[path] = rule
        # A static path that a template also matches needs what either needs.
        with_patterns = {
            path: [rule, *(r for regex, r in patterns if regex.fullmatch(path))]
            for path, rule in static.items()
        }
        return cls(with_patterns, patterns)

    def needed(self, method: str, path: str) -> Scope | None:
        rules = self._static.get(path)
        if rules is None:
            rules = [rule for regex, rule in self._patterns if regex.fullmatch(path)]
        # As the router picks: a route of this method if any matches (GET
        # /v1/users/a/route is the route's, not DELETE /v1/users/{uid:uid}'s), else
        # the 405 to come.
        with_method = [r for r in rules if method in r.by_method]
        return max(
            (r.scope_for(method) for r in with_method or rules),
            key=_RANK.__getitem__,
            default=None,
        )


def _template_regex(template: str) -> re.Pattern[str]:
    # A path parameter is one segment, as Starlette's default (str) convertor matches it.
    parts = re.split(r"\{[^}/]+\}", template)
    return re.compile("[^/]+".join(re.escape(part) for part in parts))


class KeyGate:
    """401/403 from the headers alone, before the app (and its body parsing) runs."""

    def __init__(self, app: ASGIApp, keys: ApiKeys, rules: AccessRules) -> None:
        self.app = app
        self.keys = keys
        self.rules = rules

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        needed = self.rules.needed(scope["method"], route_path(scope))
        if needed is None:
            await self.app(scope, receive, send)
            return
        key, has_body = presented(scope["headers"])
        denial = authorize(self.keys, key, needed)
        if denial is None:
            await self.app(scope, receive, send)
            return
        await _refuse(send, denial, close=has_body)


async def _refuse(send: Send, denial: Denial, close: bool) -> None:
    headers = [(b"www-authenticate", denial.www_authenticate.encode())]
    if close:
        # The body was never read: closing drops it, instead of the server reading and
        # discarding it to get to the next request on this connection.
        headers.append((b"connection", b"close"))
    await send_error(send, denial.status, denial.error, denial.detail, headers)
