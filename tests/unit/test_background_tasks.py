"""`shared.tasks.Background`: each task kept until it ends, a failure logged where it
happens, and the two ways to end them together (drain, bounded or not; cancel)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from shared.tasks import Background

log = logging.getLogger("tests.background")


async def test_a_task_is_held_until_it_ends() -> None:
    tasks = Background("a chore", log)
    gate = asyncio.Event()

    async def chore() -> None:
        await gate.wait()

    task = tasks.spawn(chore(), "chore")
    assert len(tasks) == 1 and task.get_name() == "chore"
    gate.set()
    await task
    await asyncio.sleep(0)  # its done callback runs on the next turn
    assert len(tasks) == 0


async def test_a_failure_is_logged_on_the_owners_logger_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = Background("a chore", log)

    async def broken() -> None:
        raise KeyError("a bug")

    async def stopped() -> None:
        await asyncio.sleep(60)

    with caplog.at_level("ERROR", "tests.background"):
        tasks.spawn(broken())
        tasks.spawn(stopped()).cancel()  # a cancelled task is no failure
        await tasks.drain()
    [record] = [r for r in caplog.records if r.name == "tests.background"]
    assert record.getMessage() == "a chore failed"
    assert record.exc_info is not None and record.exc_info[0] is KeyError


async def test_drain_waits_for_the_tasks_started_meanwhile() -> None:
    tasks = Background("a chore", log)
    ended: list[str] = []

    async def second() -> None:
        await asyncio.sleep(0.02)
        ended.append("second")

    async def first() -> None:
        await asyncio.sleep(0.01)
        tasks.spawn(second())
        ended.append("first")

    tasks.spawn(first())
    assert await tasks.drain() == 0
    assert ended == ["first", "second"]


async def test_drain_past_its_bound_says_how_many_still_run_and_leaves_them() -> None:
    tasks = Background("a chore", log)
    gate = asyncio.Event()

    async def waits() -> None:
        await gate.wait()

    task = tasks.spawn(waits())
    assert await tasks.drain(timeout_s=0.02) == 1
    assert not task.done()
    gate.set()
    assert await tasks.drain(timeout_s=1.0) == 0


@pytest.mark.parametrize("floor_s", [0.0, 0.3])
async def test_a_task_started_at_the_last_moment_gets_the_floor(floor_s: float) -> None:
    tasks = Background("a chore", log)

    async def unregister() -> None:
        await asyncio.sleep(0.1)

    async def register() -> None:
        await asyncio.sleep(0.05)
        tasks.spawn(unregister())  # each unregister follows its register

    tasks.spawn(register())
    still = await tasks.drain(timeout_s=0.06, floor_s=floor_s)
    assert still == (0 if floor_s else 1)
    await tasks.cancel()


async def test_cancel_ends_every_task_and_those_their_ends_start() -> None:
    tasks = Background("a chore", log)
    started: list[asyncio.Task[object]] = []

    async def late() -> None:
        await asyncio.sleep(60)

    async def sleeper() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            started.append(tasks.spawn(late()))

    first = tasks.spawn(sleeper())
    await asyncio.sleep(0)
    await asyncio.wait_for(tasks.cancel(), 1.0)
    assert first.cancelled() and [t.cancelled() for t in started] == [True]
    assert len(tasks) == 0
