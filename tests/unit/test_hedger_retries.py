"""The hedger on an injected clock (nothing sleeps): the original's retries, the total
timeout, throttling and stalls."""

from __future__ import annotations

import asyncio

import pytest

from router.hedging import AUTO, AttemptContext, Hedger, HedgingSettings, RetrySettings
from router.testing import ManualClock
from shared.errors import BusUnavailable
from tests.unit.hedger_calls import Calls, Fatal, Retryable, advance, hedger, settle, start


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
    publish = await start(h, calls)
    calls.answer(0, Fatal("bad request"))
    with pytest.raises(Fatal):
        await publish
    assert len(calls.pending) == 1


async def test_retries_stop_at_the_total_timeout(clock: ManualClock) -> None:
    retry = RetrySettings(initial_rpc_timeout_s=1, total_timeout_s=1.0, initial_backoff_s=0.4)
    h, calls = Hedger(None, retry, clock, lambda e: isinstance(e, Retryable)), Calls()
    publish = await start(h, calls)
    calls.answer(0, Retryable("1"))
    await settle()
    await advance(clock, 0.4)
    assert calls.pending[1][0].timeout_s == pytest.approx(0.6)  # what is left of the total
    clock.advance(0.3)
    calls.answer(1, Retryable("2"))  # 0.3 s left: less than the next backoff (0.8)
    with pytest.raises(Retryable, match="2"):
        await publish


async def _slow_run(clock: ManualClock, h: Hedger, latencies: list[float]) -> list[int]:
    """Publishes one after another, the i-th answered latencies[i] s after it began;
    returns how many hedges each one sent."""
    hedges_per_publish = []
    for latency in latencies:
        calls = Calls()
        publish = await start(h, calls)
        await advance(clock, latency)
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
        publish = await start(h, calls)
        await advance(clock, 1.5)
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
    publish = await start(h, calls)
    clock.mono += 1.5  # a stall: time passes without the timer getting to run
    await advance(clock, 0)  # the 1 s timer runs 0.5 s late
    assert calls.hedges == [0]
    await advance(clock, 0.009)
    assert calls.hedges == [0]
    await advance(clock, 0.001)  # still unanswered after the grace: hedge
    assert calls.hedges == [0, 1]
    calls.answer(0, "ok")
    assert await publish == "ok"


async def test_an_answer_read_after_a_stall_sends_no_hedge(clock: ManualClock) -> None:
    h, calls = hedger(clock, tokens=5), Calls()
    publish = await start(h, calls)
    clock.mono += 1.5
    clock.advance(0)
    calls.answer(0, "was waiting")  # read during the grace
    assert await publish == "was waiting"
    await advance(clock, 0.01)
    assert calls.hedges == [0]
    assert (b := h.bucket("t")) is not None and b.milli_tokens == 5100


async def test_no_timer_is_left_once_no_hedge_fits_in_the_total_timeout(
    clock: ManualClock,
) -> None:
    retry = RetrySettings(initial_rpc_timeout_s=2.5, max_rpc_timeout_s=2.5, total_timeout_s=2.5)
    h, calls = hedger(clock, tokens=0, retry=retry), Calls()
    publish = await start(h, calls)
    await advance(clock, 2.0)  # ticks at 1 and 2 s found no token; a third would be past 2.5 s
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
