"""Browsers on other origins: the two things an app's own pages need from the push
service, and nothing else (IMROUTE_CORS_ORIGINS).

An app serves its pages from its own site (`https://chat.example.com`) and the push
service from another (`https://push.example.com`). Its pages import the browser client
(`/client/imroute.js`, a module script: fetched in CORS mode) and call
`GET /v1/dispatch` with the client's token in an `Authorization` header (a preflight
first). A browser lets a page read either only when the answer names the page's origin
(the Fetch standard's CORS protocol), so without this the SDK cannot start anywhere but
on the push service's own origin.

- Only those two (dispatch, and the client's files): every other endpoint takes an API
  key, which never belongs in a page; a browser on another origin gets no CORS header
  from them, so it cannot read what they answer.
- Only the origins listed: an answer names the caller's origin when it is one of them
  (`Vary: Origin`, as caches must key on it), or any origin for `*`. The token is a
  header the page sets, not a cookie, so no credentials mode is involved.
- A preflight (`OPTIONS` with `Access-Control-Request-Method`) is answered here, before
  any gate: 204 allowing `GET` and the `Authorization` header for an origin listed;
  403 in JSON naming the origin (or the method, or the header) otherwise.
- Every other request goes on as it came; an answer to an origin listed (a 401, a 503,
  a 500 included, so the SDK can tell them apart) gets the origin and `Retry-After`
  exposed. Every answer on these paths says `Vary: Origin`.

Off (no layer at all) unless IMROUTE_CORS_ORIGINS names an origin.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from push_service.admission import route_path
from push_service.errors import send_error

__all__ = ["ClientCors"]

ANY = "*"
# What the pages on other origins may reach: the dispatch call and the client's files.
PATHS = ("/v1/dispatch",)
PREFIXES = ("/client/",)
MAX_AGE_S = 600  # how long a browser may reuse a preflight's answer


class ClientCors:
    """The CORS answers of the client-facing paths, for the origins listed."""

    def __init__(self, app: ASGIApp, origins: Iterable[str]) -> None:
        """`origins`: as IMROUTE_CORS_ORIGINS holds them, as browsers send an Origin."""
        self.app = app
        self._origins = frozenset(origins)
        self._any = ANY in self._origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _client_facing(route_path(scope)):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        origin_raw = headers.get(b"origin")
        origin = None if origin_raw is None else origin_raw.decode("latin-1")
        allowed = origin is not None and (self._any or origin.lower() in self._origins)
        if (
            origin is not None
            and scope["method"] == "OPTIONS"
            and b"access-control-request-method" in headers
        ):
            await self._preflight(scope, headers, origin, allowed, send)
            return
        # Every answer here depends on the Origin (a cache must not give one without CORS
        # headers to an origin listed); only one to an origin listed names it (others,
        # without, cannot read it).
        cors = _cors_headers(origin) if allowed and origin is not None else _VARY

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *cors]}
            await send(message)

        await self.app(scope, receive, sending)

    async def _preflight(
        self, scope: Scope, headers: dict[bytes, bytes], origin: str, allowed: bool, send: Send
    ) -> None:
        path = route_path(scope)
        method = headers[b"access-control-request-method"].decode("latin-1")
        asked = headers.get(b"access-control-request-headers", b"").decode("latin-1")
        extra = [h for h in (h.strip().lower() for h in asked.split(",")) if h]
        if not allowed:
            problem = (
                f"origin {origin[:100]!r} may not call {path} from a browser: it is not "
                "in the push service's IMROUTE_CORS_ORIGINS"
            )
        elif method != "GET":
            problem = f"{path} takes GET from other origins, not {method[:20]}"
        elif bad := [h for h in extra if h != "authorization"]:
            problem = (
                f"{path} takes only the Authorization header from other origins, "
                f"not {bad[0][:60]!r}"
            )
        else:
            start: Message = {
                "type": "http.response.start",
                "status": 204,
                "headers": [
                    *_cors_headers(origin),
                    (b"access-control-allow-methods", b"GET"),
                    (b"access-control-allow-headers", b"Authorization"),
                    (b"access-control-max-age", str(MAX_AGE_S).encode()),
                ],
            }
            await send(start)
            await send({"type": "http.response.body", "body": b""})
            return
        await send_error(send, 403, "forbidden", problem, [(b"vary", b"Origin")])


def _client_facing(path: str) -> bool:
    return path in PATHS or path.startswith(PREFIXES)


_VARY = ((b"vary", b"Origin"),)


def _cors_headers(origin: str) -> Sequence[tuple[bytes, bytes]]:
    return (
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"access-control-expose-headers", b"Retry-After"),
        (b"vary", b"Origin"),
    )
