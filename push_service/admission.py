"""Who may make a request, and when: the gate every request passes before its body is
read, and what it decides with. Each refusal is a JSON answer from the headers alone
(`push_service.errors.send_error`), in this order:

1. **Load** (503 `overloaded`, `Retry-After`). A saturated push service answers at once
   rather than queueing work for callers that will have given up by the time it is
   done. One process (each worker) decides for itself, from what it can see:
   - *In flight.* At most `IMROUTE_HTTP_MAX_IN_FLIGHT` requests are handled at once; the
     next is refused. A bound on concurrency is a bound on the queue inside the process:
     past it, more requests only make each slower (they share one event loop, one Redis
     pool and the gateways' calls) until every caller times out.
   - *Event-loop lag.* A small task sleeps `LAG_EVERY_S` and measures how late it wakes;
     the lag is smoothed (an EWMA of a third, as Node's toobusy does) and a wake-up that
     is overdue right now counts at once. While it is over `IMROUTE_HTTP_MAX_LAG_MS` and
     at least `LAG_MIN_IN_FLIGHT` requests are in flight, new ones are refused: the
     process is CPU-bound, and every request it admits waits behind the others. With few
     requests in flight a stall is not overload (a collection, one large body parsed)
     and sheds nothing.
   The operator's requests are never shed nor counted: health, metrics, the dashboard
   and the reads behind it, the fleet list, drains and the docs, so /healthz and the
   dashboard answer while the API sheds. A shed request did nothing, so a retry (with
   its `Idempotency-Key`) is safe.
2. **The key** (401, or 403 for a valid key of the other scope). Two API keys:
   - `PUSH` (IMROUTE_API_KEY): pushes, broadcast, multicast, jobs, routes, the fleet list.
   - `ADMIN` (IMROUTE_ADMIN_API_KEY): drains and user-directory writes. Without an admin
     key the push key holds both scopes. With one, each key holds only its own scope:
     the admin key cannot push (least privilege; an operator's key leaks less than a
     sender's).
   FastAPI resolves a handler's dependencies only after it has read and parsed the
   body, so a key checked there comes too late: an unauthenticated 160 MiB multicast
   was read and parsed (4 GB of Python objects) before its 401. Here it is judged
   first, so the large body limits of `/v1/multicast` and `/v1/users` are reached only
   with a valid key. The gate and the handlers' dependencies
   (`push_service.routes.deps`, kept as a second line) both decide with `authorize`, so
   the two cannot disagree; keys are compared in constant time
   (`shared.auth.api_key_matches`). Which scope each route needs (`AccessRules`) is
   read from the app's OpenAPI document, the security scheme each operation names, so
   the gate, the handlers and the published schema cannot disagree either.
3. **The rate** (429 `rate_limited`, `Retry-After`; 503 if its store cannot answer).
   The per-API-key limit of the sending endpoints (`IMROUTE_RATE_LIMIT`, off unless
   set; `push_service.ratelimit`), counted only for a valid key and answered before the
   body is read or parsed. What is counted is requests, not recipients: a push carries
   at most 1000 uids and a broadcast's count is unknown until it has paged the
   directory, so requests are what a caller can predict and what each costs to accept.
4. **The body's size** (413 `payload_too_large`): over its path's limit by its
   `Content-Length`, or while it is read; the app then sees a disconnect.

A refusal of a request that announced a body it will not read closes the connection
(rather than the server reading the body to get to the next request); a shed one only
where the body is large (`errors.large_body`): under overload, callers reconnecting after
every 503 would cost more.

One ASGI layer for the four, not four layers: each layer a request crosses is an `await`
and a closure on every request of the hottest path.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Send
from starlette.types import Scope as AsgiScope

from push_service.errors import large_body, send_error
from push_service.ratelimit.base import RateLimiter
from push_service.tracing_http import TracedRequests, TracerSlot
from shared.auth import api_key_matches
from shared.errors import ImrouteError
from shared.periodic import Periodic
from shared.settings import PushSettings
from shared.throttled import ThrottledLine

__all__ = [
    "IN_FLIGHT",
    "LAG",
    "LAG_EVERY_S",
    "LAG_MIN_IN_FLIGHT",
    "SENDING_PATHS",
    "AccessRules",
    "Admission",
    "ApiKeys",
    "Denial",
    "LimiterSlot",
    "LoopLag",
    "Scope",
    "ShedMetrics",
    "Shedder",
    "authorize",
    "bearer_token",
    "bucket_of",
    "is_operator",
    "presented",
    "route_path",
]

# Each gate's lines keep the logger they had as a module of its own, so a filter or a
# level an operator set on them still holds.
shed_log = logging.getLogger("push_service.shedding")
rate_log = logging.getLogger("push_service.ratelimit.http")

Header = tuple[bytes, bytes]

# ---------------------------------------------------------------------------- load

LAG_EVERY_S = 0.05
LAG_SMOOTHING = 1 / 3
LAG_MIN_IN_FLIGHT = 8
RETRY_AFTER_S = 1
IN_FLIGHT = "in_flight"
LAG = "lag"

_OPERATOR_PATHS = frozenset({"/healthz", "/metrics", "/docs", "/openapi.json", "/v1/gateways"})
_OPERATOR_PREFIXES = ("/dashboard", "/client/", "/docs/", "/v1/admin/")


def is_operator(method: str, path: str) -> bool:
    """Whether a request is the operator's: never shed, never counted."""
    if method == "POST":  # a drain: the operator's way out of an overloaded gateway
        return path.startswith("/v1/gateways/") and path.endswith("/drain")
    if method not in ("GET", "HEAD"):
        return False
    return path in _OPERATOR_PATHS or path.startswith(_OPERATOR_PREFIXES)


class LoopLag:
    """How far behind its event loop this process runs, in seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.smoothed_s = 0.0
        self._clock = clock
        self.due: float | None = None  # when the measuring task should wake next

    def measured(self, lag_s: float) -> None:
        self.smoothed_s += LAG_SMOOTHING * (max(0.0, lag_s) - self.smoothed_s)

    def now_s(self) -> float:
        """The smoothed lag, or the measuring task's lateness now if that is more."""
        overdue = 0.0 if self.due is None else self._clock() - self.due
        return max(self.smoothed_s, overdue)

    def measuring(self, every_s: float = LAG_EVERY_S) -> Periodic:
        """The measuring task: a wake-up every `every_s`, how late it came measured."""

        async def woke() -> None:
            if self.due is not None:
                self.measured(self._clock() - self.due)
            self.due = self._clock() + every_s

        self.due = self._clock() + every_s
        return Periodic("loop lag", woke, every_s, log=shed_log, at_once=False)


class Shedder:
    """The decision and its counts (pure: the gate and the lag task feed it)."""

    def __init__(self, max_in_flight: int, max_lag_ms: int, lag: LoopLag | None = None) -> None:
        self.max_in_flight = max_in_flight
        self.max_lag_s = max_lag_ms / 1000
        self.lag = lag or LoopLag()
        self.in_flight = 0
        self.shed = {IN_FLIGHT: 0, LAG: 0}

    def refuse(self) -> str | None:
        """Why a new request must be shed now (IN_FLIGHT or LAG), or None to admit it."""
        if self.in_flight >= self.max_in_flight:
            return IN_FLIGHT
        if (
            self.max_lag_s > 0
            and self.in_flight >= LAG_MIN_IN_FLIGHT
            and self.lag.now_s() > self.max_lag_s
        ):
            return LAG
        return None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The lag measured while the block runs (off with IMROUTE_HTTP_MAX_LAG_MS=0)."""
        if self.max_lag_s <= 0:
            yield
            return
        async with self.lag.measuring():
            yield

    def describe(self, reason: str) -> str:
        if reason == IN_FLIGHT:
            return (
                f"overloaded: {self.in_flight} requests in flight in this process "
                f"(IMROUTE_HTTP_MAX_IN_FLIGHT); nothing was done, retry in {RETRY_AFTER_S} s"
            )
        return (
            f"overloaded: the event loop runs {self.lag.now_s() * 1000:.0f} ms behind "
            f"(IMROUTE_HTTP_MAX_LAG_MS {self.max_lag_s * 1000:.0f}); nothing was done, "
            f"retry in {RETRY_AFTER_S} s"
        )


class ShedMetrics(Collector):
    def __init__(self, shedder: Shedder) -> None:
        self._shedder = shedder

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        shed = CounterMetricFamily(
            "imroute_http_shed",
            "Requests answered 503 overloaded, before any work, by reason",
            labels=["reason"],
        )
        for reason, n in self._shedder.shed.items():
            shed.add_metric([reason], n)
        yield shed
        yield GaugeMetricFamily(
            "imroute_http_in_flight",
            "Requests being handled (the operator's not counted)",
            self._shedder.in_flight,
        )
        yield GaugeMetricFamily(
            "imroute_event_loop_lag_seconds",
            "How far behind its event loop the process runs (smoothed)",
            self._shedder.lag.now_s(),
        )


# ---------------------------------------------------------------------------- the key


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


# ---------------------------------------------------------------------------- the rate

# A batch (POST /v1/push/batch) is one request too: at most 1000 messages, bounded like a multicast.
SENDING_PATHS = frozenset({"/v1/push", "/v1/push/batch", "/v1/broadcast", "/v1/multicast"})


class LimiterSlot:
    """Where the app's lifespan puts the limiter once Redis is open (None: no limit)."""

    limiter: RateLimiter | None = None


def bucket_of(api_key: str) -> str:
    """The bucket of a key: a hash, so the key itself is never stored in Redis."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:32]


# ---------------------------------------------------------------------------- the gate


@dataclass(slots=True, eq=False)
class Admission:
    """The four checks, in order, before the app runs (see the module's docstring)."""

    app: ASGIApp
    shedder: Shedder
    keys: ApiKeys
    rules: AccessRules
    limiter: LimiterSlot
    max_bytes: int
    per_path: Mapping[str, int] = field(default_factory=dict)  # else max_bytes
    # With tracing on: a push's root span starts once it is past the load check, so it
    # covers the other refusals (a 401, 429 or 413 is on the record) while a request
    # shed costs nothing more under tracing (push_service.tracing_http).
    traced: TracerSlot | None = None
    # A 429 flood is one line per 10 s, with the count since; so is an overload.
    _rate_line: ThrottledLine = field(
        default_factory=lambda: ThrottledLine(
            rate_log,
            "%(n)d requests over IMROUTE_RATE_LIMIT refused (429) since the last line, "
            "%(total)d in all",
        ),
        init=False,
    )
    _shed_line: ThrottledLine = field(
        default_factory=lambda: ThrottledLine(
            shed_log, "%(n)d requests shed (503 overloaded) since the last line; in all: %(shed)s"
        ),
        init=False,
    )
    _admitted: ASGIApp = field(init=False)  # the checks past the load's, traced or not

    @property
    def rate_refused(self) -> int:
        """Requests refused 429."""
        return self._rate_line.total

    def __post_init__(self) -> None:
        traced = self.traced
        self._admitted = self._admit if traced is None else TracedRequests(self._admit, traced)

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if is_operator(scope["method"], route_path(scope)):
            await self._admitted(scope, receive, send)
            return
        shedder = self.shedder
        reason = shedder.refuse()
        if reason is not None:
            await self._shed(scope, send, reason)
            return
        shedder.in_flight += 1
        try:
            await self._admitted(scope, receive, send)
        finally:
            shedder.in_flight -= 1

    async def _shed(self, scope: AsgiScope, send: Send, reason: str) -> None:
        shedder = self.shedder
        shedder.shed[reason] += 1
        self._shed_line.note(shed=shedder.shed)
        # A small body the server skips and the connection is kept: under overload,
        # callers reconnecting after every 503 would cost more.
        retry = [(b"retry-after", str(RETRY_AFTER_S).encode())]
        close = large_body(scope["headers"])
        await _refuse(send, 503, "overloaded", shedder.describe(reason), retry, close)

    async def _admit(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        """The key, the rate and the body's size."""
        method = scope["method"]
        path = route_path(scope)
        needed = self.rules.needed(method, path)
        if needed is not None:
            key, has_body = presented(scope["headers"])
            denial = authorize(self.keys, key, needed)
            if denial is not None:
                challenge = [(b"www-authenticate", denial.www_authenticate.encode())]
                await _refuse(send, denial.status, denial.error, denial.detail, challenge, has_body)
                return
            limiter = self.limiter.limiter
            if limiter is not None and method == "POST" and path in SENDING_PATHS:
                assert key is not None  # authorized
                if not await self._within_rate(limiter, key, send, has_body):
                    return
        await self._limited(scope, receive, send, self.per_path.get(path, self.max_bytes))

    async def _within_rate(
        self, limiter: RateLimiter, key: str, send: Send, has_body: bool
    ) -> bool:
        """Whether the key is within its rate; else it is answered here."""
        try:
            wait = await limiter.take(bucket_of(key))
        except ImrouteError as exc:
            retry = [(b"retry-after", b"1")]
            detail = f"rate limit store: {exc}"
            await _refuse(send, 503, "unavailable", detail, retry, has_body)
            return False
        if wait is None:
            return True
        self._rate_line.note()
        detail = (
            f"over IMROUTE_RATE_LIMIT ({limiter.limit.describe()}) for this API key: "
            f"retry in {wait:.3f} s"
        )
        retry = [(b"retry-after", str(max(1, math.ceil(wait))).encode())]
        await _refuse(send, 429, "rate_limited", detail, retry, has_body)
        return False

    async def _limited(self, scope: AsgiScope, receive: Receive, send: Send, limit: int) -> None:
        """The app, reading a body of at most `limit` bytes."""
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                await _too_large(send, limit)
                return
        seen = 0
        rejected = False

        async def counting_receive() -> Message:
            nonlocal seen, rejected
            if rejected:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    # Answer here: an exception would be turned into a 400 by the app's
                    # body parsing before it reached us. The app then sees a disconnect.
                    rejected = True
                    await _too_large(send, limit)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not rejected:  # the 413 is the whole answer
                await send(message)

        await self.app(scope, counting_receive, guarded_send)


async def _refuse(
    send: Send, status: int, error: str, detail: str, headers: list[Header], close: bool
) -> None:
    """The refusal, closing the connection where `close`: its body was never read, and
    closing drops it, instead of the server reading it to get to the next request."""
    if close:
        headers.append((b"connection", b"close"))
    await send_error(send, status, error, detail, headers)


async def _too_large(send: Send, limit: int) -> None:
    await send_error(send, 413, "payload_too_large", f"request body over {limit} bytes")
