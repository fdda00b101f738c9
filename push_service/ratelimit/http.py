"""The per-API-key rate limit of the sending endpoints, as a pure-ASGI gate.

It runs inside the key gate (so the key it counts against is a valid one) and before
the body limit and the app, so a request over the limit is answered 429 from its headers
alone: its body is never read or parsed. What is counted is requests, not recipients:
a push carries at most 1000 uids and a broadcast's count is unknown until it has paged
the directory, so requests are what a caller can predict and what each costs to accept.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time

from starlette.types import ASGIApp, Receive, Scope, Send

from push_service.access import presented, route_path
from push_service.errors import send_error
from push_service.ratelimit.base import RateLimiter
from shared.errors import ImrouteError
from shared.throttled import Throttled

__all__ = ["SENDING_PATHS", "LimiterSlot", "RateGate", "bucket_of"]

log = logging.getLogger(__name__)

# A batch (POST /v1/push/batch) is one request too: at most 1000 messages, bounded like a multicast.
SENDING_PATHS = frozenset({"/v1/push", "/v1/push/batch", "/v1/broadcast", "/v1/multicast"})


class LimiterSlot:
    """Where the app's lifespan puts the limiter once Redis is open (None: no limit)."""

    limiter: RateLimiter | None = None


def bucket_of(api_key: str) -> str:
    """The bucket of a key: a hash, so the key itself is never stored in Redis."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:32]


class RateGate:
    def __init__(self, app: ASGIApp, slot: LimiterSlot) -> None:
        self.app = app
        self.slot = slot
        self.refused = 0
        self._line = Throttled()  # a 429 flood is one line per 10 s, with the count since

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limiter = self.slot.limiter
        if (
            limiter is None
            or scope["type"] != "http"
            or scope["method"] != "POST"
            or route_path(scope) not in SENDING_PATHS
        ):
            await self.app(scope, receive, send)
            return
        key, has_body = presented(scope["headers"])
        if key is None:  # the key gate let it through without one: not ours to judge
            await self.app(scope, receive, send)
            return
        try:
            wait = await limiter.take(bucket_of(key))
        except ImrouteError as exc:
            await _answer(send, 503, "unavailable", f"rate limit store: {exc}", 1, has_body)
            return
        if wait is None:
            await self.app(scope, receive, send)
            return
        self.refused += 1
        if since := self._line.note(time.monotonic()):
            log.warning(
                "%d requests over IMROUTE_RATE_LIMIT refused (429) since the last line, %d in all",
                since,
                self.refused,
            )
        detail = (
            f"over IMROUTE_RATE_LIMIT ({limiter.limit.describe()}) for this API key: "
            f"retry in {wait:.3f} s"
        )
        await _answer(send, 429, "rate_limited", detail, max(1, math.ceil(wait)), has_body)


async def _answer(
    send: Send, status: int, error: str, detail: str, retry_after: int, close: bool
) -> None:
    headers = [(b"retry-after", str(retry_after).encode())]
    if close:  # the body was never read: closing drops it
        headers.append((b"connection", b"close"))
    await send_error(send, status, error, detail, headers)
