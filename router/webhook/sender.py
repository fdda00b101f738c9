"""The webhook sender: a task in every push service that POSTs the outbox's events.

Each pass takes up to `batch_max` events (first those a dead sender left, then new
ones) and POSTs them as one signed ``{"events":[...]}`` request. A 2xx acks them; a 5xx,
408, 429, timeout or connection error keeps them and retries the same batch with
exponential backoff (re-signed each time, so a receiver back after minutes gets a fresh
``t``), for as long as it takes; any other status drops them, counted and logged. A
POST has `timeout_s` in all and reads a few KiB of the answer (`exchange`): a receiver
cannot stall the queue for longer, nor swell the process. The push path never waits for
any of it: producers only add to the outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx

from router.redis.client import RedisClient
from router.webhook.base import events_body
from router.webhook.consumer import Entry, OutboxConsumer
from router.webhook.delivery import BACKOFF_BASE_S, Outcome, outcome_of
from router.webhook.exchange import ANSWER_READ_BYTES, Answer, Cut, post_bounded
from router.webhook.outbox import OutboxStats, RedisOutbox
from router.webhook.signing import HEADER, sign
from shared.backoff import backoff_s
from shared.clock import Clock
from shared.errors import ImrouteError, RegistryRefused
from shared.keys import KeySchema
from shared.throttled import ThrottledLine

__all__ = ["MAX_BODY_BYTES", "WebhookSender", "split_by_bytes"]

log = logging.getLogger(__name__)

STATS_EVERY_S = 1.0
REDIS_RETRY_S = 1.0
# A POST carries at most this many bytes of events (and at least one event).
MAX_BODY_BYTES = 1 << 20


class WebhookSender:
    """Delivers the outbox to `url`; counters for /metrics. The secret is never logged."""

    def __init__(
        self,
        redis: RedisClient,
        keys: KeySchema,
        outbox: RedisOutbox,
        clock: Clock,
        *,
        url: str,
        secret: str,
        timeout_s: float,
        batch_max: int,
        backoff_max_s: float,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        consumer = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        # Longer than a sender ever leaves its entries untouched (one POST, which the
        # deadline bounds, and one backoff): only a dead sender's entries go idle this long.
        claim_idle_ms = int((2 * (timeout_s + backoff_max_s) + 5) * 1000)
        self.consumer = OutboxConsumer(redis, keys, consumer, claim_idle_ms)
        self._outbox = outbox
        self._clock = clock
        self._url = url
        self._secret = secret
        self._batch_max = batch_max
        self._backoff_max_s = backoff_max_s
        self._timeout_s = timeout_s
        self._http = httpx.AsyncClient(
            timeout=None,  # post_bounded's deadline covers the whole POST
            transport=transport,
            follow_redirects=False,
            headers={"User-Agent": "imroute-webhook/1"},
        )
        self.sent = 0  # events acknowledged with a 2xx
        self.retried = 0  # failed attempts that will be retried (one per POST)
        self.dropped = 0  # events refused with a status that is not retried
        # POSTs cut off: no answer by the deadline (retried), or a long answer (closed)
        self.cuts = {
            cut: ThrottledLine(
                log,
                "webhook sender cut off %(n)d POST(s) (%(cut)s) since the last such line: "
                "%(detail)s; a POST has IMROUTE_WEBHOOK_TIMEOUT_S=%(timeout_s)gs in all and "
                "reads %(read)d bytes of an answer",
                now=clock.monotonic,
            )
            for cut in Cut
        }
        self.stats = OutboxStats(0, 0)  # fleet-wide, refreshed every STATS_EVERY_S
        self._next_claim = 0.0
        self._next_stats = 0.0

    async def run(self) -> None:
        await self._until_ok(self.consumer.ensure_group)
        while True:
            try:
                await self._refresh_stats()
                batch = await self._next_batch()
            except ImrouteError as exc:
                log.warning("webhook sender: %s; retrying in %.0fs", exc, REDIS_RETRY_S)
                await asyncio.sleep(REDIS_RETRY_S)
                continue
            except Exception:  # the loop must outlive a bug; what it held is claimed later
                log.exception("webhook sender failed; going on")
                await asyncio.sleep(REDIS_RETRY_S)
                continue
            parts = split_by_bytes(batch, MAX_BODY_BYTES)
            for i, part in enumerate(parts):
                try:
                    # The parts after this one are held too: kept from going idle (and
                    # being taken over by another sender) while this one is retried.
                    await self._deliver(part, [e for later in parts[i + 1 :] for e in later])
                except Exception:  # a bug: the rest is claimed once idle, and sent again
                    log.exception("webhook sender failed delivering a batch; going on")
                    await asyncio.sleep(REDIS_RETRY_S)
                    break

    async def _next_batch(self) -> list[Entry]:
        now = self._clock.monotonic()
        if now >= self._next_claim:
            claimed = await self.consumer.claim_idle(self._batch_max)
            if claimed:
                log.info("webhook sender: took over %d events of a gone sender", len(claimed))
                return claimed
            self._next_claim = now + self.consumer.claim_idle_ms / 4000
        return await self.consumer.read(self._batch_max)

    async def _deliver(self, batch: list[Entry], later: list[Entry]) -> None:
        """POST `batch` until it is acknowledged or refused for good; `later`: entries
        held for the POSTs after it, touched with it."""
        body = events_body([e.event for e in batch])
        failures = 0
        while True:
            answer = await self._post(body)
            status, detail = self._noted(answer)
            outcome = outcome_of(status)
            if outcome is Outcome.RETRY:
                failures += 1
                self.retried += 1
                delay = backoff_s(failures, BACKOFF_BASE_S, self._backoff_max_s)
                if answer.retry_after_s is not None:
                    # As long as the receiver asks, within IMROUTE_WEBHOOK_BACKOFF_MAX_S
                    delay = min(max(delay, answer.retry_after_s), self._backoff_max_s)
                log.warning(
                    "webhook POST of %d events failed (%s); retry %d in %.1fs",
                    len(batch),
                    detail,
                    failures,
                    delay,
                )
                await asyncio.sleep(delay)
                await self._until_ok(lambda: self.consumer.touch(batch + later))
                with contextlib.suppress(ImrouteError):  # the queue grows while we wait
                    await self._refresh_stats()
                continue
            if outcome is Outcome.SENT:
                self.sent += len(batch)
            else:
                self.dropped += len(batch)
                log.error(
                    "webhook receiver refused %d events with %s: dropped (not retried)",
                    len(batch),
                    detail,
                )
            await self._until_ok(lambda: self.consumer.done(batch))
            return

    async def _post(self, body: bytes) -> Answer:
        t = self._clock.now_ms() // 1000
        headers = {"Content-Type": "application/json", HEADER: sign(self._secret, body, t)}
        return await post_bounded(self._http, self._url, body, headers, self._timeout_s)

    def _noted(self, answer: Answer) -> tuple[int | None, str]:
        """The answer's status and detail, a cut counted (and logged, throttled)."""
        if answer.cut is not None:
            self.cuts[answer.cut].note(
                cut=answer.cut.value,
                detail=answer.detail,
                timeout_s=self._timeout_s,
                read=ANSWER_READ_BYTES,
            )
        return answer.status, answer.detail

    async def _refresh_stats(self) -> None:
        now = self._clock.monotonic()
        if now >= self._next_stats:
            self._next_stats = now + STATS_EVERY_S
            self.stats = await self._outbox.stats()

    async def _until_ok(self, step: Callable[[], Awaitable[None]]) -> None:
        """Run a Redis step until Redis answers (an ack lost to an outage would make the
        batch be sent again by whoever claims it: allowed, but avoided). A step Redis
        refuses (it would refuse it again) is given up, logged: its entries may be sent
        again by a sender that claims them."""
        while True:
            try:
                await step()
                return
            except RegistryRefused as exc:
                log.error("webhook sender: %s; going on without it", exc)
                return
            except ImrouteError as exc:
                log.warning("webhook sender: %s; retrying in %.0fs", exc, REDIS_RETRY_S)
                await asyncio.sleep(REDIS_RETRY_S)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        task = asyncio.create_task(self.run(), name="webhook-sender")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await self._http.aclose()


def split_by_bytes(batch: list[Entry], limit: int) -> list[list[Entry]]:
    """`batch` as POSTs of at most `limit` bytes of events each (one event alone may be
    larger: a 1000-uid message.unacked is about 25 KB, so 100 of them would be 2.5 MB)."""
    parts: list[list[Entry]] = []
    size = limit
    for entry in batch:
        n = len(entry.event.encode()) + 1
        if size + n > limit and (not parts or parts[-1]):
            parts.append([])
            size = 0
        parts[-1].append(entry)
        size += n
    return parts
