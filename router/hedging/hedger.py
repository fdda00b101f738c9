"""Hedged publishing, to Google Cloud Pub/Sub's documented semantics, for any transport.

1. Send the original attempt. It is retried on retryable errors (exponential backoff
   with jitter), each try with its own timeout, all within the total timeout.
2. Every hedge delay, while nothing has succeeded, the original has not failed for
   good, a token is available and the total timeout has not passed: take a token and
   send one more attempt of the same batch. Earlier attempts stay outstanding.
   Hedges are never retried, and their errors are discarded.
3. The first success wins: every other attempt is cancelled (and awaited), and the
   bucket gets `refill_ratio` tokens. Tokens come only with successes, so sustained
   slowness or errors drain the bucket and stop hedging by themselves.
4. The publish fails only when the original has failed for good and every hedge
   still outstanding has failed too; it then raises the original's error.

No task outlives `run`: whatever is left is cancelled and awaited before it returns.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from router.hedging.delay import HedgeDelay
from router.hedging.settings import HedgingSettings, RetrySettings, check_compatible
from router.hedging.tokens import TokenBucket
from shared.backoff import backoff_s
from shared.clock import AsyncClock, Cancellable
from shared.errors import BusUnavailable
from shared.throttled import ThrottledLine

__all__ = ["Attempt", "AttemptContext", "HedgeObserver", "Hedger", "NullObserver"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# A hedge timer that fires this late means the publishing process itself stalled; the
# hedge then waits this much longer, for answers that arrived during the stall.
STALL_S = 0.05
STALL_GRACE_S = 0.01


@dataclass(frozen=True, slots=True)
class AttemptContext:
    """What one attempt needs to know: which it is, and how long it may take."""

    hedge: int  # 0: the original (each of its retries too); n: the n-th hedge
    timeout_s: float
    start_wall_ms: int  # when the publish began, for the telemetry header


Attempt = Callable[[AttemptContext], Awaitable[T]]


class HedgeObserver(Protocol):
    """Where the hedger reports what it does (metrics); every call is per topic."""

    def attempt(self, topic: str, hedge: bool) -> None: ...
    def hedge_won(self, topic: str) -> None: ...
    def cancelled(self, topic: str, n: int) -> None: ...
    def tokens(self, topic: str, value: float) -> None: ...
    def latency(self, topic: str, seconds: float) -> None: ...


class NullObserver:
    def attempt(self, topic: str, hedge: bool) -> None:
        pass

    def hedge_won(self, topic: str) -> None:
        pass

    def cancelled(self, topic: str, n: int) -> None:
        pass

    def tokens(self, topic: str, value: float) -> None:
        pass

    def latency(self, topic: str, seconds: float) -> None:
        pass


class Hedger:
    """Runs publishes with retries and, when given HedgingSettings, hedges them."""

    def __init__(
        self,
        hedging: HedgingSettings | None,
        retry: RetrySettings,
        clock: AsyncClock,
        is_retryable: Callable[[BaseException], bool],
        *,
        message_ordering: bool = False,
        observer: HedgeObserver | None = None,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        check_compatible(hedging, retry, message_ordering=message_ordering)
        self.hedging = hedging
        self.retry = retry
        self._clock = clock
        self._is_retryable = is_retryable
        self._observer: HedgeObserver = observer or NullObserver()
        self._jitter = jitter
        # Retries are the one sign of an outage before a publish fails: a line per 10 s.
        self.retries = ThrottledLine(
            log,
            "publish to %(topic)s retried (%(n)d retries since the last line): %(exc)s",
            now=clock.monotonic,
        )
        # Per topic, as Google's clients have one publisher (and bucket) per topic.
        self._buckets: dict[str, TokenBucket] = {}
        self._delays: dict[str, HedgeDelay] = {}

    def bucket(self, topic: str) -> TokenBucket | None:
        """The topic's token bucket; None without hedging."""
        if self.hedging is None:
            return None
        bucket = self._buckets.get(topic)
        if bucket is None:
            bucket = self._buckets[topic] = TokenBucket(
                self.hedging.max_tokens, self.hedging.refill_ratio
            )
        return bucket

    def delay(self, topic: str) -> HedgeDelay | None:
        """The topic's hedge delay; None without hedging."""
        if self.hedging is None:
            return None
        delay = self._delays.get(topic)
        if delay is None:
            ceiling = min(self.retry.initial_rpc_timeout_s, self.retry.total_timeout_s)
            delay = self._delays[topic] = HedgeDelay(self.hedging, ceiling)
        return delay

    async def run(self, topic: str, attempt: Attempt[T]) -> T:
        """The first successful attempt's result, or the original's terminal error."""
        return await _Publish(self, topic, attempt).run()


class _Publish(Generic[T]):
    """One publish: its original (with retries), its hedges, and its hedge timer.

    Callback-driven, so a publish in flight costs one timer callback per hedge delay
    and nothing else: no task wakes up to look for tokens.
    """

    def __init__(self, hedger: Hedger, topic: str, attempt: Attempt[T]) -> None:
        self.h = hedger
        self.topic = topic
        self.attempt = attempt
        self.clock = hedger._clock
        self.started = self.clock.monotonic()
        self.start_wall_ms = self.clock.now_ms()
        self.deadline = self.started + hedger.retry.total_timeout_s
        self.finished: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self.attempts: dict[asyncio.Task[T], int] = {}
        self.timer: Cancellable | None = None
        self.due = 0.0
        self.hedges = 0
        self.original_error: BaseException | None = None
        self.cancelling = False
        self.bucket = hedger.bucket(topic)
        self.delay = hedger.delay(topic)

    async def run(self) -> T:
        self._launch(self._original(), 0)
        self._arm()
        try:
            return await self.finished
        finally:
            await self._cancel_the_rest()

    def _launch(self, coro: Coroutine[Any, Any, T], n: int) -> None:
        task = asyncio.ensure_future(coro)
        self.attempts[task] = n
        task.add_done_callback(self._on_attempt_done)

    def _on_attempt_done(self, task: asyncio.Task[T]) -> None:
        n = self.attempts.pop(task)
        if self.finished.done() or self.cancelling:
            return
        if task.cancelled():
            # Not by us: something else ended it (grpc.aio cancels the calls of a
            # channel that closes). It failed, and the publish must not wait for it.
            error: BaseException = BusUnavailable("a publish attempt was cancelled")
        else:
            error = task.exception()  # type: ignore[assignment]
        if error is None:
            self.finished.set_result(self._won(task.result(), n))
            return
        if n == 0:
            self.original_error = error  # hedges' errors are discarded
            self._disarm()  # no new hedges once the original failed for good
        if self.original_error is not None and not self.attempts:
            self.finished.set_exception(self.original_error)

    def _arm(self) -> None:
        """Hedge after the delay, while the original may still succeed in time."""
        if self.delay is None or self.original_error is not None or self.finished.done():
            return
        delay = self.delay.current()
        if self.clock.monotonic() + delay >= self.deadline:
            return  # past the total timeout: no hedge could be sent
        self.due = self.clock.monotonic() + delay
        self.timer = self.clock.call_later(delay, self._tick)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _tick(self, after_stall: bool = False) -> None:
        self.timer = None
        if self.finished.done() or self.original_error is not None:
            return
        if not after_stall and self.clock.monotonic() - self.due > STALL_S:
            # A timer that fires late means this process stalled: answers may be
            # waiting unread, and every publish in flight would hedge at once. Let the
            # loop read them first, then decide.
            self.timer = self.clock.call_later(STALL_GRACE_S, functools.partial(self._tick, True))
            return
        if self._may_hedge():
            self.hedges += 1
            self.h._observer.attempt(self.topic, hedge=True)
            self._launch(self._hedge(self.hedges), self.hedges)
            self._report_tokens()
        self._arm()

    async def _cancel_the_rest(self) -> None:
        self.cancelling = True
        self._disarm()
        leftovers = list(self.attempts)
        cancelled = sum(task.cancel() for task in leftovers)
        if leftovers:
            await asyncio.gather(*leftovers, return_exceptions=True)
        won = self.finished.done() and not self.finished.cancelled()
        if won and self.finished.exception() is None and cancelled:
            # Losers only: attempts another one beat, not those of a cancelled publish.
            self.h._observer.cancelled(self.topic, cancelled)

    def _may_hedge(self) -> bool:
        bucket = self.bucket
        return (
            bucket is not None and self.clock.monotonic() < self.deadline and bucket.try_acquire()
        )

    def _won(self, result: T, n: int) -> T:
        obs = self.h._observer
        elapsed = self.clock.monotonic() - self.started
        if self.bucket is not None:
            self.bucket.refill()
            self._report_tokens()
        if n > 0:
            obs.hedge_won(self.topic)
        obs.latency(self.topic, elapsed)
        return result

    def _report_tokens(self) -> None:
        if self.bucket is not None:
            self.h._observer.tokens(self.topic, self.bucket.tokens)

    def _remaining(self) -> float:
        return self.deadline - self.clock.monotonic()

    async def _call(self, n: int, timeout_s: float) -> T:
        """One RPC attempt; `auto` learns how long it was out when it succeeded, or
        when it was cancelled as a loser (then at least that long)."""
        started = self.clock.monotonic()
        learn = False
        try:
            result = await self.attempt(AttemptContext(n, timeout_s, self.start_wall_ms))
            learn = True
            return result
        except asyncio.CancelledError:
            learn = True  # a loser: it was out at least this long
            raise
        finally:
            # Failures are left out: fast errors would pull the p95 (and the delay) down
            # just when the service is failing.
            if learn and self.delay is not None:
                self.delay.record(self.clock.monotonic() - started)

    async def _hedge(self, n: int) -> T:
        return await self._call(n, min(self.h.retry.initial_rpc_timeout_s, self._remaining()))

    async def _original(self) -> T:
        r, obs = self.h.retry, self.h._observer
        rpc_timeout, retries = r.initial_rpc_timeout_s, 0
        while True:
            obs.attempt(self.topic, hedge=False)
            timeout = min(rpc_timeout, self._remaining())
            try:
                return await self._call(0, timeout)
            except Exception as exc:
                if not self.h._is_retryable(exc):
                    raise
                retries += 1
                pause = backoff_s(
                    retries,
                    r.initial_backoff_s,
                    r.max_backoff_s,
                    factor=r.backoff_multiplier,
                    rand=self.h._jitter,
                )
                if self._remaining() <= pause:
                    raise  # the total timeout leaves no room for another try
                self.h.retries.note(topic=self.topic, exc=exc)
            await self.clock.sleep(pause)
            rpc_timeout = min(rpc_timeout * r.rpc_timeout_multiplier, r.max_rpc_timeout_s)
