"""shared.periodic on a manual clock: steps at the interval, failures logged and
throttled, cancellation passed through, the task stopped with the block."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from router.testing import ManualClock
from shared.errors import RegistryUnavailable
from shared.periodic import Periodic

log = logging.getLogger("tests.periodic")


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_steps_at_once_then_every_interval_until_the_block_ends() -> None:
    clock = ManualClock()
    steps: list[float] = []

    async def step() -> None:
        steps.append(clock.monotonic())

    async with Periodic("p", step, 2.0, log=log, clock=clock) as periodic:
        await turns()
        assert steps == [0.0]
        for _ in range(3):
            clock.advance(2.0)
            await turns()
        task = periodic.task
        assert task is not None and not task.done()
    assert steps == [0.0, 2.0, 4.0, 6.0]
    assert task.cancelled() and periodic.task is None


async def test_not_at_once_waits_an_interval_first() -> None:
    clock = ManualClock()
    steps: list[float] = []

    async def step() -> None:
        steps.append(clock.monotonic())

    async with Periodic("p", step, 1.0, log=log, at_once=False, clock=clock):
        await turns()
        assert steps == []
        clock.advance(1.0)
        await turns()
    assert steps == [1.0]


async def test_fixed_rate_does_not_add_the_steps_time() -> None:
    clock = ManualClock()
    steps: list[float] = []

    async def slow_step() -> None:
        steps.append(clock.monotonic())
        await clock.sleep(0.5)

    async with Periodic("p", slow_step, 2.0, log=log, at_once=False, fixed_rate=True, clock=clock):
        await turns()
        for _ in range(12):
            clock.advance(0.5)
            await turns()
    assert steps == [2.0, 4.0, 6.0]


async def test_failures_are_logged_throttled_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise ValueError("a bug")
        raise RegistryUnavailable("redis: connection refused")

    periodic = Periodic("the sweep", step, 1.0, log=log, log_every_s=10.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="tests.periodic"):
        async with periodic:
            await turns()
            for _ in range(11):
                clock.advance(1.0)
                await turns()
    assert calls == 12
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "the sweep: redis: connection refused",
        "the sweep: redis: connection refused (10 failures since the last line)",
    ]
    assert periodic.failed.total == 12


async def test_an_unexpected_error_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def step() -> None:
        raise ValueError("a bug")

    with caplog.at_level(logging.WARNING, logger="tests.periodic"):
        await Periodic("p", step, 1.0, log=log, clock=ManualClock()).step()
    [record] = caplog.records
    assert record.getMessage() == "p failed unexpectedly; going on"
    assert record.exc_info is not None


async def test_cancellation_is_not_swallowed() -> None:
    clock = ManualClock()
    started = asyncio.Event()

    async def step() -> None:
        started.set()
        await asyncio.Event().wait()

    periodic = Periodic("p", step, 1.0, log=log, clock=clock)
    task = asyncio.create_task(periodic.run())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_stop_before_start_is_a_no_op() -> None:
    async def step() -> None:
        pass

    await Periodic("p", step, 1.0, log=log).stop()


async def test_a_step_that_swallows_the_cancellation_still_ends_the_loop() -> None:
    entered = asyncio.Event()

    async def swallowing() -> None:
        entered.set()
        with contextlib.suppress(asyncio.CancelledError):  # as a library mid-command may
            await asyncio.sleep(10)

    loop = Periodic("swallower", swallowing, 0.001, log=logging.getLogger("t"))
    loop.start()
    await entered.wait()
    async with asyncio.timeout(1):
        await loop.stop()  # returns: the loop did not step on


async def test_stop_keeps_the_callers_own_cancellation() -> None:
    async def slow_to_end() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            await asyncio.sleep(0.05)  # the loop takes a while to end

    loop = Periodic("slow", slow_to_end, 1.0, log=logging.getLogger("t"))
    loop.start()
    await asyncio.sleep(0)
    stopper = asyncio.create_task(loop.stop())
    await asyncio.sleep(0.01)
    stopper.cancel()  # the caller is cancelled while it waits for the loop
    with pytest.raises(asyncio.CancelledError):
        await stopper
