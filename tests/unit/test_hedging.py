"""Hedged publishing's pure core: settings, the token bucket, the delay, and the hedger's
timing with an injected clock (nothing sleeps)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from router.hedging import (
    AUTO,
    AttemptContext,
    HedgeDelay,
    Hedger,
    HedgingSettings,
    RetrySettings,
    TokenBucket,
)
from shared.clock import ManualClock
from shared.errors import BusUnavailable


class Retryable(Exception):
    pass


class Fatal(Exception):
    pass


@dataclass
class Recorder:
    """A HedgeObserver that keeps everything."""

    attempts: list[bool] = field(default_factory=list)
    wins: int = 0
    n_cancelled: int = 0
    token_values: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)

    def attempt(self, topic: str, hedge: bool) -> None:
        self.attempts.append(hedge)

    def hedge_won(self, topic: str) -> None:
        self.wins += 1

    def cancelled(self, topic: str, n: int) -> None:
        self.n_cancelled += n

    def tokens(self, topic: str, value: float) -> None:
        self.token_values.append(value)

    def latency(self, topic: str, seconds: float) -> None:
        self.latencies.append(seconds)


class Calls:
    """An attempt function whose calls the test answers, one future per call."""

    def __init__(self) -> None:
        self.pending: list[tuple[AttemptContext, asyncio.Future[str]]] = []
        self.cancelled: list[int] = []

    async def __call__(self, ctx: AttemptContext) -> str:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.pending.append((ctx, future))
        try:
            return await future
        except asyncio.CancelledError:
            self.cancelled.append(ctx.hedge)
            raise

    @property
    def hedges(self) -> list[int]:
        return [ctx.hedge for ctx, _ in self.pending]

    def answer(self, index: int, value: str | BaseException) -> None:
        future = self.pending[index][1]
        if isinstance(value, BaseException):
            future.set_exception(value)
        else:
            future.set_result(value)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def hedger(
    clock: ManualClock,
    *,
    delay: float | str = 1.0,
    max_tokens: int = 50,
    ratio: float = 0.1,
    tokens: int = 0,
    retry: RetrySettings | None = None,
    observer: Recorder | None = None,
) -> Hedger:
    h = Hedger(
        HedgingSettings(delay, max_tokens, ratio),  # type: ignore[arg-type]
        retry or RetrySettings(),
        clock,
        lambda exc: isinstance(exc, Retryable),
        observer=observer,
        jitter=lambda: 1.0,
    )
    bucket = h.bucket("t")
    assert bucket is not None
    bucket._milli = tokens * 1000
    return h


# --- settings ---------------------------------------------------------------------


def test_defaults_are_googles() -> None:
    s = HedgingSettings()
    assert (s.hedge_delay, s.max_tokens, s.refill_ratio) == (1.0, 50, 0.1)


@pytest.mark.parametrize(
    ("kwargs", "field", "allowed"),
    [
        ({"hedge_delay": 0.099}, "hedge_delay", "100 ms to 10 s"),
        ({"hedge_delay": 10.5}, "hedge_delay", "100 ms to 10 s"),
        ({"max_tokens": 0}, "max_tokens", "1 to 250"),
        ({"max_tokens": 251}, "max_tokens", "1 to 250"),
        ({"refill_ratio": 0.0009}, "refill_ratio", "0.001 to 0.2"),
        ({"refill_ratio": 0.21}, "refill_ratio", "0.001 to 0.2"),
    ],
)
def test_out_of_range_settings_name_the_field_and_range(
    kwargs: dict[str, Any], field: str, allowed: str
) -> None:
    with pytest.raises(ValueError, match=field) as info:
        HedgingSettings(**kwargs)
    assert allowed in str(info.value)


@pytest.mark.parametrize("value", ["fast", True, None])
def test_a_delay_must_be_seconds_or_auto(value: Any) -> None:
    with pytest.raises(ValueError, match="hedge_delay"):
        HedgingSettings(hedge_delay=value)
    assert HedgingSettings(hedge_delay=AUTO).auto


def test_the_edges_of_each_range_are_allowed() -> None:
    HedgingSettings(0.1, 1, 0.001)
    HedgingSettings(10.0, 250, 0.2)


def test_hedge_delay_must_be_below_both_retry_timeouts(clock: ManualClock) -> None:
    with pytest.raises(ValueError, match="initial_rpc_timeout_s"):
        Hedger(HedgingSettings(2.0), RetrySettings(initial_rpc_timeout_s=2.0), clock, bool)
    with pytest.raises(ValueError, match="total_timeout_s"):
        Hedger(
            HedgingSettings(2.0),
            RetrySettings(initial_rpc_timeout_s=5, max_rpc_timeout_s=5, total_timeout_s=1.5),
            clock,
            bool,
        )
    Hedger(HedgingSettings(1.9), RetrySettings(initial_rpc_timeout_s=2.0), clock, bool)


def test_hedging_and_ordering_keys_do_not_mix(clock: ManualClock) -> None:
    with pytest.raises(ValueError, match="ordering"):
        Hedger(HedgingSettings(), RetrySettings(), clock, bool, message_ordering=True)
    Hedger(None, RetrySettings(), clock, bool, message_ordering=True)  # no hedging: fine


# --- the token bucket ---------------------------------------------------------------


def test_the_bucket_starts_empty_and_ten_refills_of_a_tenth_make_one_token() -> None:
    bucket = TokenBucket(50, 0.1)
    assert bucket.milli_tokens == 0 and not bucket.try_acquire()
    for _ in range(9):
        bucket.refill()
    assert bucket.milli_tokens == 900 and not bucket.try_acquire()
    bucket.refill()
    assert bucket.milli_tokens == 1000
    assert bucket.try_acquire() and bucket.milli_tokens == 0


def test_refills_stop_at_max_tokens() -> None:
    bucket = TokenBucket(2, 0.2)
    for _ in range(100):
        bucket.refill()
    assert bucket.tokens == 2.0
    tiny = TokenBucket(1, 0.001)
    for _ in range(999):
        tiny.refill()
    assert not tiny.try_acquire()
    tiny.refill()
    assert tiny.try_acquire()


def test_the_bucket_is_safe_across_threads() -> None:
    bucket = TokenBucket(250, 0.2)
    for _ in range(5 * 100):  # 100 tokens
        bucket.refill()
    taken: list[bool] = []
    lock = threading.Lock()

    def grab() -> None:
        mine = [bucket.try_acquire() for _ in range(50)]
        with lock:
            taken.extend(mine)

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(taken) == 100 and bucket.milli_tokens == 0


# --- the automatic delay ------------------------------------------------------------


def test_auto_delay_follows_the_p95_within_the_range() -> None:
    delay = HedgeDelay(HedgingSettings(AUTO), ceiling_s=5.0, window=100, min_samples=10)
    assert delay.current() == 1.0  # Google's default until it has seen enough
    for i in range(100):
        delay.record(0.2 + i / 1000)  # 0.200 .. 0.299
    assert delay.current() == pytest.approx(0.295)
    for _ in range(100):
        delay.record(0.001)  # the window rolls over: everything fast now
    assert delay.current() == 0.1  # clamped to the minimum
    for _ in range(100):
        delay.record(30.0)
    assert delay.current() == pytest.approx(5.0 * 0.999)  # below the retry timeouts


# --- the hedger, on an injected clock -----------------------------------------------


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


async def test_no_hedge_when_the_first_attempt_beats_the_delay(clock: ManualClock) -> None:
    rec = Recorder()
    h, calls = hedger(clock, tokens=5, observer=rec), Calls()
    publish = asyncio.ensure_future(h.run("t", calls))
    await settle()
    clock.advance(0.999)
    await settle()
    calls.answer(0, "id-1")
    assert await publish == "id-1"
    assert calls.hedges == [0] and rec.attempts == [False]
    assert (b := h.bucket("t")) is not None and b.milli_tokens == 5100  # refilled by 0.1
    clock.advance(5)
    await settle()
    assert calls.hedges == [0]  # and its timer is gone: nothing fires later


async def test_a_slow_first_attempt_is_beaten_by_a_hedge_and_cancelled(
    clock: ManualClock,
) -> None:
    rec = Recorder()
    h, calls = hedger(clock, tokens=1, observer=rec), Calls()
    publish = asyncio.ensure_future(h.run("t", calls))
    await settle()
    clock.advance(1.0)
    await settle()
    assert calls.hedges == [0, 1]
    assert not calls.pending[0][1].done()  # the first stays outstanding
    calls.answer(1, "from-hedge")
    assert await publish == "from-hedge"
    assert calls.cancelled == [0]
    assert (rec.wins, rec.n_cancelled, rec.attempts) == (1, 1, [False, True])
    assert (b := h.bucket("t")) is not None and b.milli_tokens == 100  # 1 - 1 + 0.1


async def test_hedges_repeat_every_delay_until_the_tokens_run_out(clock: ManualClock) -> None:
    h, calls = hedger(clock, tokens=3), Calls()
    publish = asyncio.ensure_future(h.run("t", calls))
    await settle()
    seen = []
    for _ in range(5):
        clock.advance(1.0)
        await settle()
        seen.append(len(calls.pending))
    assert seen == [2, 3, 4, 4, 4]
    assert calls.hedges == [0, 1, 2, 3]
    calls.answer(0, "first")
    assert await publish == "first"
    assert sorted(calls.cancelled) == [1, 2, 3]


async def test_no_hedge_without_tokens(clock: ManualClock) -> None:
    h, calls = hedger(clock, tokens=0), Calls()
    publish = asyncio.ensure_future(h.run("t", calls))
    await settle()
    clock.advance(3.5)
    await settle()
    assert calls.hedges == [0]
    calls.answer(0, "ok")
    assert await publish == "ok"


async def test_hedged_errors_are_discarded(clock: ManualClock) -> None:
    h, calls = hedger(clock, tokens=2), Calls()
    publish = asyncio.ensure_future(h.run("t", calls))
    await settle()
    clock.advance(1.0)
    await settle()
    calls.answer(1, Fatal("the hedge failed"))
    await settle()
    assert not publish.done()
    clock.advance(1.0)
    await settle()
    assert calls.hedges == [0, 1, 2]
    calls.answer(0, "original")
    assert await publish == "original"


async def test_the_originals_terminal_error_fails_the_publish_once_hedges_are_done(
    clock: ManualClock,
) -> None:
    h, calls = hedger(clock, tokens=2), Calls()
    publish = asyncio.ensure_future(h.run("t", calls))
    await settle()
    clock.advance(1.0)
    await settle()
    calls.answer(0, Fatal("not retryable"))
    await settle()
    assert not publish.done()  # a hedge is still out and may succeed
    clock.advance(1.0)
    await settle()
    assert calls.hedges == [0, 1]  # no new hedge after the original failed for good
    calls.answer(1, Retryable("the hedge failed too"))
    with pytest.raises(Fatal, match="not retryable"):
        await publish


async def test_a_hedge_may_succeed_after_the_original_failed(clock: ManualClock) -> None:
    h, calls = hedger(clock, tokens=1), Calls()
    publish = asyncio.ensure_future(h.run("t", calls))
    await settle()
    clock.advance(1.0)
    await settle()
    calls.answer(0, Fatal("no"))
    await settle()
    calls.answer(1, "saved")
    assert await publish == "saved"


async def test_the_original_is_retried_with_backoff_and_growing_timeouts(
    clock: ManualClock,
) -> None:
    retry = RetrySettings(
        initial_rpc_timeout_s=2.0, rpc_timeout_multiplier=2, max_rpc_timeout_s=5,
        total_timeout_s=60, initial_backoff_s=0.1, backoff_multiplier=2, max_backoff_s=1,
    )  # fmt: skip
    h, calls = Hedger(None, retry, clock, lambda e: isinstance(e, Retryable)), Calls()
    publish = asyncio.ensure_future(h.run("t", calls))
    timeouts = []
    for i in range(4):
        await settle()
        timeouts.append(calls.pending[i][0].timeout_s)
        calls.answer(i, Retryable(f"try {i}"))
        await settle()
        assert len(calls.pending) == i + 1  # waits out its backoff first
        clock.advance(0.1 * 2**i)  # jitter is 1.0 here: the full backoff
    await settle()
    calls.answer(4, "fifth time lucky")
    assert await publish == "fifth time lucky"
    assert timeouts == [2.0, 4.0, 5.0, 5.0]
    assert calls.hedges == [0] * 5


async def test_a_fatal_error_is_not_retried(clock: ManualClock) -> None:
    h, calls = Hedger(None, RetrySettings(), clock, lambda e: isinstance(e, Retryable)), Calls()
    publish = asyncio.ensure_future(h.run("t", calls))
    await settle()
    calls.answer(0, Fatal("bad request"))
    with pytest.raises(Fatal):
        await publish
    assert len(calls.pending) == 1


async def test_retries_stop_at_the_total_timeout(clock: ManualClock) -> None:
    retry = RetrySettings(initial_rpc_timeout_s=1, total_timeout_s=1.0, initial_backoff_s=0.4)
    h, calls = Hedger(None, retry, clock, lambda e: isinstance(e, Retryable)), Calls()
    publish = asyncio.ensure_future(h.run("t", calls))
    await settle()
    calls.answer(0, Retryable("1"))
    await settle()
    clock.advance(0.4)
    await settle()
    assert calls.pending[1][0].timeout_s == pytest.approx(0.6)  # what is left of the total
    clock.advance(0.3)
    calls.answer(1, Retryable("2"))  # 0.3 s left: less than the next backoff (0.8)
    with pytest.raises(Retryable, match="2"):
        await publish


async def test_cancelling_the_publish_cancels_every_attempt(clock: ManualClock) -> None:
    h, calls = hedger(clock, tokens=5), Calls()
    publish = asyncio.ensure_future(h.run("t", calls))
    await settle()
    clock.advance(1.0)
    await settle()
    publish.cancel()
    with pytest.raises(asyncio.CancelledError):
        await publish
    assert sorted(calls.cancelled) == [0, 1]
    assert all(f.cancelled() for _, f in calls.pending)


async def test_concurrent_publishes_share_the_bucket(clock: ManualClock) -> None:
    h = hedger(clock, tokens=3)
    calls = [Calls() for _ in range(10)]
    publishes = [asyncio.ensure_future(h.run("t", c)) for c in calls]
    await settle()
    clock.advance(1.0)
    await settle()
    assert sum(len(c.pending) - 1 for c in calls) == 3  # three tokens, three hedges
    for c in calls:
        c.answer(0, "ok")
    assert await asyncio.gather(*publishes) == ["ok"] * 10
    assert (b := h.bucket("t")) is not None and b.milli_tokens == 1000  # ten refills of 0.1


async def _slow_run(clock: ManualClock, h: Hedger, latencies: list[float]) -> list[int]:
    """Publishes one after another, the i-th answered latencies[i] s after it began;
    returns how many hedges each one sent."""
    hedges_per_publish = []
    for latency in latencies:
        calls = Calls()
        publish = asyncio.ensure_future(h.run("t", calls))
        await settle()
        clock.advance(latency)
        await settle()
        calls.answer(0, "slow")
        await publish
        hedges_per_publish.append(len(calls.pending) - 1)
    return hedges_per_publish


# 1.50 .. 2.49 s, each value once per 100 publishes, in a scrambled order.
SLOW = [1.5 + (i * 37 % 100) / 100 for i in range(300)]


async def test_a_sustained_slowdown_throttles_hedging_to_the_refill_ratio(
    clock: ManualClock,
) -> None:
    # Every call takes 1.5-2.5 s against a 1 s delay: the full bucket pays for hedges
    # at first, then only every tenth publish refills a token.
    h = hedger(clock, tokens=50, ratio=0.1)
    hedges = await _slow_run(clock, h, SLOW)
    # While the bucket lasts, a hedge every delay: one before 2 s, two after.
    assert hedges[:20] == [1 if latency < 2.0 else 2 for latency in SLOW[:20]]
    assert sum(hedges[-100:]) == 10  # 10 % of publishes: the refill ratio, no more


async def test_auto_follows_a_slowdown_and_hedges_only_past_the_p95(clock: ManualClock) -> None:
    h = hedger(clock, delay=AUTO, tokens=50, ratio=0.1)
    delay = h.delay("t")
    assert delay is not None
    hedges = await _slow_run(clock, h, SLOW)
    # The p95 of how long attempts were out; cancelled hedges count their shorter time.
    assert 2.4 <= delay.current() <= 2.5
    assert sum(hedges[-100:]) <= 6  # about the slowest 5 %, not the 10 % tokens allow


async def test_sustained_failures_drain_the_bucket_and_hedging_stops(clock: ManualClock) -> None:
    # Calls slower than their timeout fail: no success, no refill, so once the
    # bucket is empty no publish hedges any more.
    retry = RetrySettings(initial_rpc_timeout_s=1.5, total_timeout_s=1.8, initial_backoff_s=1)
    h = Hedger(
        HedgingSettings(1.0), retry, clock, lambda e: isinstance(e, Retryable), jitter=lambda: 1
    )
    bucket = h.bucket("t")
    assert bucket is not None
    bucket._milli = 5000
    hedges = []
    for _ in range(20):
        calls = Calls()
        publish = asyncio.ensure_future(h.run("t", calls))
        await settle()
        clock.advance(1.5)
        await settle()
        for i in range(len(calls.pending)):
            calls.answer(i, Retryable("deadline exceeded"))
        with pytest.raises(Retryable):
            await publish
        hedges.append(len(calls.pending) - 1)
    assert hedges == [1] * 5 + [0] * 15
    assert bucket.milli_tokens == 0


async def test_a_late_timer_means_a_stall_and_waits_for_answers_first(
    clock: ManualClock,
) -> None:
    # The publishing process stalled past the delay: answers may be waiting unread, so
    # the late tick waits a little (10 ms) before it decides.
    h, calls = hedger(clock, tokens=5), Calls()
    publish = asyncio.ensure_future(h.run("t", calls))
    await settle()
    clock.mono += 1.5  # a stall: time passes without the timer getting to run
    clock.advance(0)  # the 1 s timer runs 0.5 s late
    await settle()
    assert calls.hedges == [0]
    clock.advance(0.009)
    await settle()
    assert calls.hedges == [0]
    clock.advance(0.001)  # still unanswered after the grace: hedge
    await settle()
    assert calls.hedges == [0, 1]
    calls.answer(0, "ok")
    assert await publish == "ok"


async def test_an_answer_read_after_a_stall_sends_no_hedge(clock: ManualClock) -> None:
    h, calls = hedger(clock, tokens=5), Calls()
    publish = asyncio.ensure_future(h.run("t", calls))
    await settle()
    clock.mono += 1.5
    clock.advance(0)
    calls.answer(0, "was waiting")  # read during the grace
    assert await publish == "was waiting"
    clock.advance(0.01)
    await settle()
    assert calls.hedges == [0]
    assert (b := h.bucket("t")) is not None and b.milli_tokens == 5100


async def test_no_timer_is_left_once_no_hedge_fits_in_the_total_timeout(
    clock: ManualClock,
) -> None:
    retry = RetrySettings(initial_rpc_timeout_s=2.5, max_rpc_timeout_s=2.5, total_timeout_s=2.5)
    h, calls = hedger(clock, tokens=0, retry=retry), Calls()
    publish = asyncio.ensure_future(h.run("t", calls))
    await settle()
    clock.advance(2.0)  # ticks at 1 and 2 s found no token; a third would be past 2.5 s
    await settle()
    assert clock._timers == []
    calls.answer(0, "ok")
    assert await publish == "ok"


async def test_an_attempt_cancelled_by_something_else_fails_the_publish(
    clock: ManualClock,
) -> None:
    # grpc.aio cancels the calls of a channel that closes: the publish must end, not
    # wait for an answer that will never come.
    async def cancelled_from_outside(ctx: AttemptContext) -> str:
        raise asyncio.CancelledError

    h = Hedger(HedgingSettings(), RetrySettings(), clock, lambda e: False)
    with pytest.raises(BusUnavailable, match="cancelled"):
        await asyncio.wait_for(h.run("t", cancelled_from_outside), 1)


async def test_cancelled_losers_are_counted_but_not_a_cancelled_publish(
    clock: ManualClock,
) -> None:
    rec = Recorder()
    h, calls = hedger(clock, tokens=5, observer=rec), Calls()
    publish = asyncio.ensure_future(h.run("t", calls))
    await settle()
    clock.advance(1.0)
    await settle()
    publish.cancel()
    with pytest.raises(asyncio.CancelledError):
        await publish
    assert rec.n_cancelled == 0  # the caller gave up: nobody won
