"""A pure-ASGI key check that answers before any body byte is read.

FastAPI resolves a handler's dependencies only after it has read and parsed the body,
so a key checked there comes too late: an unauthenticated 160 MiB multicast was read and
parsed (4 GB of Python objects) before its 401. This gate runs first, in front of
`BodyLimit`: a request to a path that needs a key and does not present it (or presents
the other scope's) is answered 401 (or 403) from its headers alone, and the large body
limits of `/v1/multicast` and `/v1/users` are reached only with a valid key.

Which scope each route needs is read from the app's OpenAPI document: the security
scheme each operation names, which the handler's own key check (`routes.deps.PushKey`
/ `AdminKey`, kept as a second line) puts there. So the gate, the handlers and the
published schema cannot disagree.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from push_service.access import ApiKeys, Denial, authorize, presented, route_path
from push_service.access import Scope as KeyScope

__all__ = ["AccessRules", "KeyGate"]

_RANK = {None: 0, KeyScope.PUSH: 1, KeyScope.ADMIN: 2}


@dataclass(slots=True)
class _PathRule:
    by_method: dict[str, KeyScope | None] = field(default_factory=dict)

    def scope_for(self, method: str) -> KeyScope | None:
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
        schemes: Mapping[str, KeyScope],
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

    def needed(self, method: str, path: str) -> KeyScope | None:
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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
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
    body = json.dumps({"error": denial.error, "detail": denial.detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", denial.www_authenticate.encode()),
    ]
    if close:
        # The body was never read: closing drops it, instead of the server reading and
        # discarding it to get to the next request on this connection.
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": denial.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
