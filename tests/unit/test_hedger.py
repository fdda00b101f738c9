"""The hedger on an injected clock (nothing sleeps): when hedges go out, which attempt
wins, and what is cancelled."""

from __future__ import annotations

import asyncio

import pytest

from router.testing import ManualClock
from tests.unit.hedger_calls import (
    Calls,
    Fatal,
    Recorder,
    Retryable,
    advance,
    hedger,
    one_delay_in,
    settle,
    start,
)


async def test_no_hedge_when_the_first_attempt_beats_the_delay(clock: ManualClock) -> None:
    rec = Recorder()
    h, calls = hedger(clock, tokens=5, observer=rec), Calls()
    publish = await start(h, calls)
    await advance(clock, 0.999)
    calls.answer(0, "id-1")
    assert await publish == "id-1"
    assert calls.hedges == [0] and rec.attempts == [False]
    assert (b := h.bucket("t")) is not None and b.milli_tokens == 5100  # refilled by 0.1
    await advance(clock, 5)
    assert calls.hedges == [0]  # and its timer is gone: nothing fires later


async def test_a_slow_first_attempt_is_beaten_by_a_hedge_and_cancelled(
    clock: ManualClock,
) -> None:
    rec = Recorder()
    h, calls, publish = await one_delay_in(clock, tokens=1, observer=rec)
    assert calls.hedges == [0, 1]
    assert not calls.pending[0][1].done()  # the first stays outstanding
    calls.answer(1, "from-hedge")
    assert await publish == "from-hedge"
    assert calls.cancelled == [0]
    assert (rec.wins, rec.n_cancelled, rec.attempts) == (1, 1, [False, True])
    assert (b := h.bucket("t")) is not None and b.milli_tokens == 100  # 1 - 1 + 0.1


async def test_hedges_repeat_every_delay_until_the_tokens_run_out(clock: ManualClock) -> None:
    h, calls = hedger(clock, tokens=3), Calls()
    publish = await start(h, calls)
    seen = []
    for _ in range(5):
        await advance(clock, 1.0)
        seen.append(len(calls.pending))
    assert seen == [2, 3, 4, 4, 4]
    assert calls.hedges == [0, 1, 2, 3]
    calls.answer(0, "first")
    assert await publish == "first"
    assert sorted(calls.cancelled) == [1, 2, 3]


async def test_no_hedge_without_tokens(clock: ManualClock) -> None:
    h, calls = hedger(clock, tokens=0), Calls()
    publish = await start(h, calls)
    await advance(clock, 3.5)
    assert calls.hedges == [0]
    calls.answer(0, "ok")
    assert await publish == "ok"


async def test_hedged_errors_are_discarded(clock: ManualClock) -> None:
    _h, calls, publish = await one_delay_in(clock, tokens=2)
    calls.answer(1, Fatal("the hedge failed"))
    await settle()
    assert not publish.done()
    await advance(clock, 1.0)
    assert calls.hedges == [0, 1, 2]
    calls.answer(0, "original")
    assert await publish == "original"


async def test_the_originals_terminal_error_fails_the_publish_once_hedges_are_done(
    clock: ManualClock,
) -> None:
    _h, calls, publish = await one_delay_in(clock, tokens=2)
    calls.answer(0, Fatal("not retryable"))
    await settle()
    assert not publish.done()  # a hedge is still out and may succeed
    await advance(clock, 1.0)
    assert calls.hedges == [0, 1]  # no new hedge after the original failed for good
    calls.answer(1, Retryable("the hedge failed too"))
    with pytest.raises(Fatal, match="not retryable"):
        await publish


async def test_a_hedge_may_succeed_after_the_original_failed(clock: ManualClock) -> None:
    _h, calls, publish = await one_delay_in(clock, tokens=1)
    calls.answer(0, Fatal("no"))
    await settle()
    calls.answer(1, "saved")
    assert await publish == "saved"


async def test_cancelling_the_publish_cancels_every_attempt(clock: ManualClock) -> None:
    _h, calls, publish = await one_delay_in(clock, tokens=5)
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
    await advance(clock, 1.0)
    assert sum(len(c.pending) - 1 for c in calls) == 3  # three tokens, three hedges
    for c in calls:
        c.answer(0, "ok")
    assert await asyncio.gather(*publishes) == ["ok"] * 10
    assert (b := h.bucket("t")) is not None and b.milli_tokens == 1000  # ten refills of 0.1


async def test_cancelled_losers_are_counted_but_not_a_cancelled_publish(
    clock: ManualClock,
) -> None:
    rec = Recorder()
    _h, _calls, publish = await one_delay_in(clock, tokens=5, observer=rec)
    publish.cancel()
    with pytest.raises(asyncio.CancelledError):
        await publish
    assert rec.n_cancelled == 0  # the caller gave up: nobody won
