"""Idempotency-Key on the push endpoints, as HTTP: claim, wait, replay, keep.

The decisions are `push_service.idempotency.base`'s; this is the shell that reads the request
(its API key, method, path and the raw body FastAPI has already read), turns a handler's
error into the answer the client would get, and replays a kept answer.

A request that finds its key still running waits for that first request, polling its
entry, for up to IMROUTE_DELIVER_TIMEOUT_S plus a margin (the longest a push runs), and
then gets the same answer; past that it gets 409. Waiting, not Stripe's immediate 409,
because the usual concurrent duplicate is a client's own timeout-and-retry racing the
first try, and the answer it wants is the first try's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from push_service.admission import bearer_token
from push_service.errors import Conflict, handler_for
from push_service.idempotency.base import (
    HEADER,
    Answer,
    Claimed,
    IdempotencyStore,
    Mismatch,
    Running,
    fingerprint,
    is_kept,
    key_hash,
    scope_hash,
)
from router.fanout.outages import ride_out
from shared.errors import ImrouteError, InvalidInput, RegistryUnavailable
from shared.tasks import Background
from shared.throttled import ThrottledLine

__all__ = ["REPLAYED_HEADER", "Handler", "Idempotency", "Once", "PartlyFailed"]

log = logging.getLogger(__name__)

# An Idempotency-Key's release (after a 5xx) or answer (after the work) that Redis did
# not take is written again in the background; in an outage every keyed request's is.
# Each kind is one line per 10 s with the count.
_RELEASE_LATER = ThrottledLine(
    log, "could not release %(n)d Idempotency-Key(s) yet (trying again): %(exc)s"
)
_KEEP_LATER = ThrottledLine(
    log, "could not keep %(n)d idempotent answer(s) yet (trying again): %(exc)s"
)
_RELEASE_GIVEN_UP = ThrottledLine(
    log, "gave up releasing %(n)d Idempotency-Key(s): retries wait for their leases"
)
_KEEP_GIVEN_UP = ThrottledLine(
    log, "gave up keeping %(n)d idempotent answer(s): retries wait for their leases"
)

REPLAYED_HEADER = "Idempotent-Replayed"  # Stripe's name, on a replayed answer
WAIT_MARGIN_S = 5.0
POLL_S = 0.05
# A release or an answer Redis refused is written again for this long (`ride_out`: a
# Cluster failover and then some).
WRITE_LATER_S = 45.0
# At shutdown the writes made later get this long to finish; one given up leaves its key
# to lapse with its lease (its retries wait for that, then run the request again).
CLOSE_S = 5.0

# A push handler, given its id seed: under an Idempotency-Key, a digest of its caller's
# scope, key and request, from which its messages take their ids
# (`push_service.content.new_message`); None without a key.
Handler = Callable[[str | None], Awaitable[Response]]


class PartlyFailed(JSONResponse):
    """A 2xx answer with a part that failed with a 5xx (a batch's message Redis could
    not take): not kept, as a 5xx is not, so a retry with the key runs the request again
    (its messages under the same ids: the SDKs drop what they already have)."""


class Idempotency:
    """Runs a push handler at most once per (API key, Idempotency-Key)."""

    def __init__(
        self,
        store: IdempotencyStore,
        wait_s: float,
        poll_s: float = POLL_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`sleep`: how writes made later wait between tries (`ride_out`)."""
        self._sleep = sleep
        self._store = store
        self._wait_s = wait_s
        self._poll_s = poll_s
        self._pending = Background("an Idempotency-Key write made later", log)

    async def _release(self, scope: str, key: str, token: str) -> None:
        """Let a retry run the request again (its answer was a 5xx). When Redis is what
        failed (a failover), the release fails too: it is made again in the background,
        so retries are not held off (409) for the whole lease once Redis is back."""
        try:
            await self._store.release(scope, key, token)
        except ImrouteError as exc:
            _RELEASE_LATER.note(exc=exc)
            self._pending.spawn(self._release_later(scope, key, token))

    async def _release_later(self, scope: str, key: str, token: str) -> None:
        try:
            await ride_out(
                lambda: self._store.release(scope, key, token),
                "releasing an Idempotency-Key",
                WRITE_LATER_S,
                self._sleep,
            )
        except RegistryUnavailable:
            _RELEASE_GIVEN_UP.note()

    async def _complete_later(self, scope: str, key: str, token: str, answer: Answer) -> None:
        try:
            await ride_out(
                lambda: self._store.complete(scope, key, token, answer),
                "keeping an idempotent answer",
                WRITE_LATER_S,
                self._sleep,
            )
        except RegistryUnavailable:
            _KEEP_GIVEN_UP.note()

    async def aclose(self, timeout_s: float = CLOSE_S) -> None:
        """Let the releases and answers written later finish, for up to `timeout_s` (a
        shutdown during an outage must not hang); those still running are given up."""
        left = await self._pending.drain(timeout_s)
        if left:
            log.warning(
                "gave up %d Idempotency-Key writes at shutdown: retries wait for the leases",
                left,
            )
            await self._pending.cancel()

    @classmethod
    def waiting_for_pushes(cls, store: IdempotencyStore, deliver_timeout_s: float) -> Idempotency:
        """Concurrent duplicates wait as long as a P2P push can take, plus a margin (and
        a push's own `wait_ack_ms`: `run`'s `longer_s`)."""
        return cls(store, deliver_timeout_s + WAIT_MARGIN_S)

    async def run(
        self, request: Request, key: str, handler: Handler, longer_s: float = 0.0
    ) -> Response:
        """The handler's answer, or the kept answer of the first request with `key`.
        `longer_s`: how much longer than a push this request runs (a duplicate, the same
        request, waits that much longer for the first's answer)."""
        scope = scope_hash(bearer_token(request.headers.get("authorization")) or "")
        # FastAPI read (and cached) the body to bind it; this reads no byte again.
        print_ = fingerprint(request.method, request.url.path, await request.body())
        # The event loop's clock: a bound on real waiting, whatever clock the app has.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_s + longer_s
        while True:
            outcome = await self._store.claim(scope, key, print_)
            if isinstance(outcome, Claimed):
                break
            if isinstance(outcome, Answer):
                return _replay(outcome)
            if isinstance(outcome, Mismatch):
                raise InvalidInput(
                    HEADER, "this key was already used with another request (method, path or body)"
                )
            assert isinstance(outcome, Running)
            if loop.time() >= deadline:
                raise Conflict(f"a request with this {HEADER} is still running; retry it later")
            await asyncio.sleep(self._poll_s)
        return await self._run_claimed(request, scope, key, print_, outcome.token, handler)

    async def _run_claimed(
        self, request: Request, scope: str, key: str, print_: str, token: str, handler: Handler
    ) -> Response:
        # A cancelled handler (a shutdown) leaves its entry running until the lease
        # lapses: the push may be half sent, and a retry at once could send it twice.
        # The request's fingerprint too: the same key reused for another request (after
        # a released 5xx, or past the key's TTL) must not name its messages as the
        # first's, which clients would drop as copies.
        try:
            response = await handler(f"{scope}:{key_hash(key)}:{print_}")
        except Exception as exc:
            rendered = await _render(request, exc)
            if rendered is None or not is_kept(rendered.status_code):
                await self._release(scope, key, token)
                if rendered is None:
                    raise
                return rendered
            response = rendered
        if not is_kept(response.status_code) or isinstance(response, PartlyFailed):
            await self._release(scope, key, token)
            return response
        answer = Answer(response.status_code, bytes(response.body))
        try:
            if not await self._store.complete(scope, key, token, answer):
                log.warning("an idempotent push outlived its lease; its answer was not kept")
        except ImrouteError as exc:
            # The push was carried out: its caller gets its answer, and a retry gets it
            # too once Redis takes it (until then the key is running: a retry waits).
            _KEEP_LATER.note(exc=exc)
            self._pending.spawn(self._complete_later(scope, key, token, answer))
        return response


class Once:
    """What a handler gets: runs its work once per Idempotency-Key, or plainly without."""

    __slots__ = ("_idempotency", "_key", "_request")

    def __init__(self, idempotency: Idempotency, request: Request, key: str | None) -> None:
        self._idempotency = idempotency
        self._request = request
        self._key = key

    async def __call__(self, handler: Handler, longer_s: float = 0.0) -> Response:
        """`longer_s`: how much longer than a push the handler may run (`wait_ack_ms`)."""
        if self._key is None:
            return await handler(None)
        return await self._idempotency.run(self._request, self._key, handler, longer_s)


def _replay(answer: Answer) -> Response:
    return Response(
        answer.body,
        status_code=answer.status,
        media_type="application/json",
        headers={REPLAYED_HEADER: "true"},
    )


async def _render(request: Request, exc: Exception) -> Response | None:
    """The answer the app's error handlers give `exc`, or None where none handles it
    (a 500 to come, which is not kept either)."""
    handler = handler_for(request.app.exception_handlers, exc)
    if handler is None:
        return None
    response: Response = await handler(request, exc)
    return response
