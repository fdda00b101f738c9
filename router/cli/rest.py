"""The REST API as the operator commands call it: where it is, its keys, one call.

The URL and keys are settings like every other (`IMROUTE_API_URL`, `IMROUTE_API_KEY`,
`IMROUTE_ADMIN_API_KEY`); a command's `--api-url` / `--api-key` / `--admin-api-key` win
over them. A key is sent as a Bearer header and never printed: an error names the key's
setting, not its value.

Each try has `timeout_s` (`--request-timeout`, DEFAULT_TIMEOUT_S) to connect, and as
long between the bytes it sends and reads.

A push service that cannot be reached (no connection: refused, no such host, no connect
within the timeout) is said at once, naming its URL, and not tried again: nothing was
sent, and one that is down stays down longer than a command should wait.

Retries that are safe: a request that got no answer is usually still carried out, so
a push retried without an `Idempotency-Key` is sent twice under a new msg_id. Each
sending command sends a key of its own (or the one `--idempotency-key` gives) and
`call` retries it, with that same key, when its connection got no answer (reset, or
none within the timeout) or the answer was 429 or 503 (nothing was done: over the
rate, shed, Redis down), after `Retry-After` or a jittered backoff, up to `retries`
times (`--retries`, DEFAULT_RETRIES), saying so on standard error before each; the
push service replays the first answer, or runs it once. GETs are retried alike; a
request without a key never is.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import httpx
from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from router.balancing.retry import RetryPolicy
from shared.errors import ImrouteError
from shared.http_answers import retry_after_s
from shared.urls import redact_url

__all__ = [
    "DEFAULT_API_URL",
    "DEFAULT_RETRIES",
    "DEFAULT_TIMEOUT_S",
    "MAX_RETRIES",
    "MAX_TIMEOUT_S",
    "RETRIES",
    "ApiSettings",
    "RemoteError",
    "RestClient",
    "new_idempotency_key",
]

DEFAULT_API_URL = "http://127.0.0.1:8080"
# One try's deadline (to connect; between bytes sent or read): the API answers within
# milliseconds, a push within its deliver timeout (2 s); `push --wait-ack` adds its wait.
DEFAULT_TIMEOUT_S = 10.0
MAX_TIMEOUT_S = 3600.0  # an hour at most (1e300 s overflowed the socket's timeout)
# 2 retries, 0.5-1 s, then 1-2 s apart (or as Retry-After says, up to 10 s)
DEFAULT_RETRIES = 2
MAX_RETRIES = 10
RETRIES = RetryPolicy(max_retries_same=DEFAULT_RETRIES, backoff_s=1.0, max_backoff_s=4.0)
RETRY_AFTER_MAX_S = 10.0
RETRIED_STATUSES = frozenset({429, 503})


def new_idempotency_key() -> str:
    """A key for one command's request, the same on each of its retries."""
    return f"imroute-cli-{uuid.uuid4().hex}"


class ApiSettings(BaseSettings):
    """Where the push service is and the keys to call it with (from the environment)."""

    model_config = SettingsConfigDict(env_prefix="IMROUTE_", extra="ignore")

    api_url: str = Field(
        DEFAULT_API_URL,
        description="where the operator commands (`imroute push`, `status`, ...) find the push "
        "service; only they read it",
    )
    api_key: SecretStr | None = Field(None, description="the key the commands send (push role)")
    admin_api_key: SecretStr | None = Field(
        None, description="the key the commands send for drains and directory writes"
    )

    @field_validator("api_url")
    @classmethod
    def _an_http_url(cls, value: str) -> str:
        """An http(s) URL with a host (the message never repeats it: it may hold a
        password)."""
        try:
            url = httpx.URL(value)
        except httpx.InvalidURL as exc:
            raise ValueError(f"not a URL ({exc})") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("must be an http:// or https:// URL with a host")
        return value


class RemoteError(ImrouteError):
    """A call the push service refused or could not be reached for; `status` 0: no answer
    (`unreachable`: no connection, or none that answered)."""

    def __init__(
        self, status: int, message: str, body: Any = None, *, unreachable: bool = False
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.unreachable = unreachable


class RestClient:
    """`notify` is told of each retry before its wait (the commands print it on
    standard error). `extra_read_s`: how much longer than `timeout_s` an answer may take
    to come (a push's `wait_ack_ms`); connecting and sending keep `timeout_s`."""

    def __init__(
        self,
        settings: ApiSettings,
        transport: httpx.BaseTransport | None = None,
        retries: RetryPolicy = RETRIES,
        sleep: Callable[[float], None] = time.sleep,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        notify: Callable[[str], None] = lambda _: None,
        extra_read_s: float = 0.0,
    ):
        self._settings = settings
        self._http = httpx.Client(
            base_url=settings.api_url.rstrip("/"),
            timeout=httpx.Timeout(timeout_s, read=timeout_s + extra_read_s),
            transport=transport,
        )
        self._timeout_s = timeout_s
        self._extra_read_s = extra_read_s
        self._retries = retries
        self._sleep = sleep
        self._notify = notify

    def __enter__(self) -> RestClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        admin: bool = False,
        idempotency_key: str | None = None,
        expect: Sequence[str] = (),
    ) -> dict[str, Any]:
        """The answer's JSON object; RemoteError for a 4xx/5xx (with the server's own
        error and detail), when the push service cannot be reached, or when the answer
        lacks a field of `expect`. A GET, or a request with `idempotency_key`, is
        retried (see the module's docstring)."""
        setting = "IMROUTE_ADMIN_API_KEY" if admin else "IMROUTE_API_KEY"
        key = self._settings.admin_api_key if admin else None
        key = key or self._settings.api_key  # without an admin key, the API key holds both
        headers = {"Authorization": f"Bearer {key.get_secret_value()}"} if key else {}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        retry_safe = method == "GET" or idempotency_key is not None
        url = redact_url(f"{self._settings.api_url.rstrip('/')}{path}")
        retry, most = 0, self._retries.max_retries_same if retry_safe else 0
        while True:
            try:
                resp = self._http.request(method, path, json=body, headers=headers)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # nothing was sent
                raise RemoteError(
                    0,
                    f"cannot reach the push service at {url}: {self._reason(exc)} "
                    "(is it running there? --api-url or IMROUTE_API_URL says where)",
                    unreachable=True,
                ) from None
            except httpx.TransportError as exc:  # no answer: it may have been carried out
                if retry < most:
                    retry += 1
                    self._wait(f"{url}: {self._reason(exc)}", retry, None)
                    continue
                tries = f" ({retry + 1} tries)" if retry else ""
                again = (
                    ""
                    if idempotency_key is None
                    else f" (to try again, sent at most once: --idempotency-key {idempotency_key})"
                )
                raise RemoteError(
                    0,
                    f"cannot reach the push service at {url}: {self._reason(exc)}{tries}{again}",
                    unreachable=True,
                ) from None
            except httpx.HTTPError as exc:
                raise RemoteError(0, f"{method} {path}: {exc}") from None
            if resp.status_code in RETRIED_STATUSES and retry < most:
                retry += 1
                self._wait(f"{url}: answered {resp.status_code}", retry, _retry_after(resp))
                continue
            break
        try:
            answer = resp.json()
        except ValueError:
            answer = None
        if resp.is_success and isinstance(answer, dict):
            missing = [name for name in expect if name not in answer]
            if missing:
                raise RemoteError(
                    resp.status_code,
                    f"{method} {path}: the answer has no {', '.join(missing)} "
                    f"(is {redact_url(self._settings.api_url)} an imroute push service?)",
                    answer,
                )
            return answer
        if resp.is_success:
            raise RemoteError(resp.status_code, f"{method} {path}: the answer is not JSON")
        raise RemoteError(resp.status_code, _describe(method, path, resp, answer, setting), answer)

    def _wait(self, what: str, retry: int, retry_after: float | None) -> None:
        """Say why and how long, then wait before the `retry`-th retry."""
        delay = retry_after or self._retries.backoff(retry)
        most = self._retries.max_retries_same
        self._notify(f"{what}; trying again in {delay:.1f} s (retry {retry} of {most})")
        self._sleep(delay)

    def _reason(self, exc: httpx.TransportError) -> str:
        """What went wrong, in words: httpx's timeouts say only "timed out"."""
        if isinstance(exc, httpx.ConnectTimeout):
            return f"no connection within {self._timeout_s:g} s"
        if isinstance(exc, httpx.ReadTimeout):
            return f"no answer within {self._timeout_s + self._extra_read_s:g} s"
        if isinstance(exc, httpx.TimeoutException):
            return f"no answer within {self._timeout_s:g} s"
        return str(exc) or type(exc).__name__


def _retry_after(resp: httpx.Response) -> float | None:
    """The seconds a 429's or 503's Retry-After asks for, at most RETRY_AFTER_MAX_S."""
    seconds = retry_after_s(resp.headers.get("retry-after"))
    return None if seconds is None else min(seconds, RETRY_AFTER_MAX_S)


def _describe(method: str, path: str, resp: httpx.Response, answer: Any, setting: str) -> str:
    """`POST /v1/push: 422 invalid_request: body.to: ...` from the server's JSON error."""
    text = f"{method} {path}: {resp.status_code}"
    if not isinstance(answer, dict):
        return f"{text} {resp.reason_phrase}"
    error = answer.get("error")
    if error:
        text += f" {error}"
    detail = answer.get("detail")
    if isinstance(detail, list):
        parts = [
            f"{d.get('field', '?')}: {d.get('message', '')}" if isinstance(d, dict) else str(d)
            for d in detail
        ]
        text += ": " + "; ".join(parts)
    elif detail:
        text += f": {detail}"
    if resp.status_code in (401, 403):
        text += f" (check {setting} or the command's key flag)"
    return text
