"""Our error tree as HTTP: each error type, its status, its JSON body and headers.

HTTP status codes live here (and in `access` and `limits`, which answer before the app
runs, and `http_server`, which answers before a request is whole). The services raise
from the tree drawn in `shared.errors`, plus the four below, which only the HTTP shell
needs:

    ImrouteError
    ├── NotFound       404 not_found   (a job, user or gateway the caller named)
    ├── Conflict       409 conflict    (the request would break a rule: draining the
    │                                   last gateway of a group)
    ├── Forbidden      403 forbidden   (a valid key of the other scope)
    ├── Unavailable    503 unavailable (a service that cannot answer now; Retry-After)
    ├── AuthError      401 unauthorized
    ├── InvalidInput   422 invalid_request
    │   └── PayloadTooLarge  413 payload_too_large
    ├── RegistryUnavailable  503 unavailable, Retry-After: 1
    └── DirectoryUnavailable 503 unavailable, Retry-After: 1

Anything else a request raises is a bug: `ServerErrors` logs it with an id and answers
500 internal_error in the same JSON shape, naming the id (Starlette's own answer is a
text/plain 500, after which uvicorn dropped the keep-alive connection without a
`Connection: close`, losing any request pipelined behind it).
"""

from __future__ import annotations

import logging
import secrets
import sys
from collections.abc import Iterator, Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.errors import (
    AuthError,
    DirectoryUnavailable,
    ImrouteError,
    InvalidInput,
    PayloadTooLarge,
    RegistryUnavailable,
)
from shared.http_answers import refusal_body
from shared.throttled import ThrottledLine

__all__ = [
    "Conflict",
    "Forbidden",
    "NotFound",
    "ServerErrors",
    "Unavailable",
    "UnavailableMetrics",
    "add_error_handlers",
    "describe_errors",
    "handler_for",
    "large_body",
    "send_error",
]

log = logging.getLogger(__name__)

# The 503s a backend that did not answer causes (a request's, or a batch message's
# result), by reason: what each tells the caller, and its line, said at most once per
# 10 s with the count (an outage answers every request so: a line each would flood the
# log).
_DOWN: dict[str, tuple[str, ThrottledLine]] = {
    reason: (what, ThrottledLine(log, "%(n)d answer(s) 503: %(what)s (%(exc)s)"))
    for reason, what in {
        "redis": "Redis unavailable; nothing was sent",
        # Its reply was lost, not its write: Redis may run it (a paused Redis, on resume).
        "redis_maybe_applied": "Redis did not answer: the request may have taken effect; "
        "retry it with the same Idempotency-Key (without one, a retry may send it twice)",
        "directory": "user directory unavailable (is it migrated? imroute db upgrade)",
    }.items()
}


class NotFound(ImrouteError):
    """What the caller named does not exist; the message says what."""


class Conflict(ImrouteError):
    """The request conflicts with the state it would change; the message says how."""


class Forbidden(ImrouteError):
    """A valid credential without the scope the endpoint needs."""

    def __init__(self, detail: str, www_authenticate: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.www_authenticate = www_authenticate


class Unavailable(ImrouteError):
    """A service cannot answer now; `retry_after_s` (if any) says when to try again."""

    def __init__(self, detail: str, retry_after_s: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after_s = retry_after_s


def add_error_handlers(app: FastAPI) -> None:
    """Our error tree as JSON: 401, 403, 404, 409, 413, 422 naming the field, and 503."""
    # Registered through the decorator, which accepts a handler of a narrower error type.
    app.exception_handler(AuthError)(_auth)
    app.exception_handler(Forbidden)(_forbidden)
    app.exception_handler(Conflict)(_conflict)
    app.exception_handler(NotFound)(_not_found)
    app.exception_handler(Unavailable)(_unavailable)
    app.exception_handler(PayloadTooLarge)(_too_large)
    app.exception_handler(InvalidInput)(_invalid)
    app.exception_handler(RequestValidationError)(_validation)
    app.exception_handler(RegistryUnavailable)(_backend_down)
    app.exception_handler(DirectoryUnavailable)(_backend_down)
    # The router's own answers (an unknown path, a method a path lacks) in the same shape.
    app.exception_handler(HTTPException)(_http)


async def _auth(_: Request, exc: AuthError) -> JSONResponse:
    return JSONResponse(
        {"error": "unauthorized", "detail": str(exc)},
        status_code=401,
        headers={"WWW-Authenticate": "Bearer"},
    )


async def _forbidden(_: Request, exc: Forbidden) -> JSONResponse:
    return JSONResponse(
        {"error": "forbidden", "detail": exc.detail},
        status_code=403,
        headers={"WWW-Authenticate": exc.www_authenticate},
    )


async def _conflict(_: Request, exc: Conflict) -> JSONResponse:
    return JSONResponse({"error": "conflict", "detail": str(exc)}, status_code=409)


async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
    return JSONResponse({"error": "not_found", "detail": str(exc)}, status_code=404)


async def _unavailable(_: Request, exc: Unavailable) -> JSONResponse:
    headers = None if exc.retry_after_s is None else {"Retry-After": str(exc.retry_after_s)}
    return JSONResponse(
        {"error": "unavailable", "detail": exc.detail}, status_code=503, headers=headers
    )


async def _too_large(_: Request, exc: PayloadTooLarge) -> JSONResponse:
    return JSONResponse(
        {"error": "payload_too_large", "detail": [{"field": exc.field, "message": exc.message}]},
        status_code=413,
    )


async def _invalid(_: Request, exc: InvalidInput) -> JSONResponse:
    return JSONResponse(
        {"error": "invalid_request", "detail": [{"field": exc.field, "message": exc.message}]},
        status_code=422,
    )


async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    detail = describe_errors(exc.errors())
    sent = request.headers.get("content-type", "")
    if isinstance(exc.body, bytes | bytearray) and not _json_type(sent):
        # A body FastAPI did not read as JSON, for its type (curl -d without -H, a form),
        # reaches validation as no object at all: say what the API takes instead of
        # pydantic's "a valid dictionary".
        for d in detail:
            if d["field"] == "body":
                d["message"] = (
                    "the body must be a JSON object sent with Content-Type: application/json "
                    f"(this request's: {sent[:100] or 'none'})"
                )
    return JSONResponse({"error": "invalid_request", "detail": detail}, status_code=422)


def _json_type(content_type: str) -> bool:
    """application/json, or a +json type (what FastAPI reads a body of as JSON)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


async def _backend_down(request: Request, exc: ImrouteError) -> JSONResponse:
    if not isinstance(exc, RegistryUnavailable):
        reason = "directory"
    elif exc.maybe_applied and request.method not in ("GET", "HEAD"):
        reason = "redis_maybe_applied"
    else:
        reason = "redis"
    what, line = _DOWN[reason]
    line.note(what=what, exc=exc)
    return JSONResponse(
        {"error": "unavailable", "detail": what},
        status_code=503,
        headers={"Retry-After": "1"},
    )


async def _http(_: Request, exc: HTTPException) -> JSONResponse:
    try:
        error = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        error = "error"
    detail = _unparsed(exc) or exc.detail
    return JSONResponse(
        {"error": error, "detail": detail}, status_code=exc.status_code, headers=exc.headers
    )


def _unparsed(exc: HTTPException) -> str | None:
    """What FastAPI's 400 "There was an error parsing the body" was, from the error it
    was raised from (a body that is no JSON text its parser can read); else None."""
    cause = exc.__cause__
    if exc.status_code != 400:
        return None
    if isinstance(cause, UnicodeDecodeError):
        return f"the body is not UTF-8 (byte {cause.start}): JSON text must be"
    if isinstance(cause, RecursionError):
        return "the body's JSON is nested too deeply to parse"
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):
        # Python's guard against quadratic int parsing (sys.get_int_max_str_digits).
        return (
            f"a number in the body has more than {sys.get_int_max_str_digits()} digits: "
            "send it as a string"
        )
    return None


def handler_for(handlers: Mapping[Any, Any], exc: BaseException) -> Any | None:
    """The app's exception handler for `exc`: its class's or its nearest base's, as
    Starlette picks it; None where none handles it (a 500 to come)."""
    for cls in type(exc).__mro__:
        handler = handlers.get(cls)
        if handler is not None:
            return handler
    return None


def describe_errors(errors: Any, prefix: tuple[Any, ...] = ()) -> list[dict[str, str]]:
    """pydantic's errors as our 422 detail: each field (its location after `prefix`,
    dotted) and what is wrong with it."""
    return [_describe_error({**err, "loc": (*prefix, *err["loc"])}) for err in errors]


def _describe_error(err: Any) -> dict[str, str]:
    if err.get("type") == "json_invalid":
        # FastAPI locates a JSON syntax error at ("body", <offset>); say so plainly.
        reason = (err.get("ctx") or {}).get("error", "")
        position = err["loc"][1] if len(err["loc"]) > 1 else "?"
        return {"field": "body", "message": f"invalid JSON at character {position}: {reason}"}
    return {"field": ".".join(str(p) for p in err["loc"]), "message": err["msg"]}


async def send_error(
    send: Send,
    status: int,
    error: str,
    detail: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """A whole JSON error answer, `{"error", "detail"}`, from pure-ASGI code."""
    body = refusal_body(error, detail)
    start = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": body})


class ServerErrors:
    """The outermost middleware: an exception no handler took becomes a logged JSON 500.

    The connection is kept (the next request on it is answered as usual; a small body
    the handler left unread the server skips) unless the request announced a large or
    chunked body, which is not worth reading to get past: then `Connection: close`. An
    exception after the answer began cannot become a 500: it is raised on, and the
    server cuts the connection, so a half answer never looks whole."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            if started:
                raise
            error_id = secrets.token_hex(6)
            log.exception("unhandled error %s on %s %s", error_id, scope["method"], scope["path"])
            headers = [(b"connection", b"close")] if large_body(scope["headers"]) else []
            await send_error(
                send,
                500,
                "internal_error",
                f"an unexpected error, logged as {error_id}: the request may have taken "
                "effect in part; retry it with the same Idempotency-Key",
                headers,
            )


SMALL_BODY = 64 << 10


def large_body(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    """Whether a request announced a body over SMALL_BODY, or one of unknown length
    (chunked): an answer that leaves it unread closes the connection rather than have
    the server read it to get to the next request. A smaller one the server skips."""
    for name, value in headers:
        if name == b"transfer-encoding":
            return True
        if name == b"content-length":
            return not value.isdigit() or int(value) > SMALL_BODY
    return False


class UnavailableMetrics(Collector):
    """The 503s a backend that did not answer caused, in this process, for /metrics."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "imroute_http_unavailable",
            "Answers 503 because Redis or the user directory did not answer: a request's, "
            "or one message's of a batch (its result's status); by reason (redis: nothing "
            "was sent; redis_maybe_applied: the request may have taken effect; directory)",
            labels=["reason"],
        )
        for reason, (_, line) in _DOWN.items():
            family.add_metric([reason], line.total)
        yield family
