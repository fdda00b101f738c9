"""A push job's Redis steps ride out a Redis that cannot answer for a while (a Cluster
failover, a restart), then give up with the last error: time and sleep injected."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import pytest
import redis.exceptions

from router.fanout.outages import TRIED_AGAIN, ride_out
from router.redis.errors import redis_errors
from shared.errors import RegistryRefused, RegistryUnavailable


class Clock:
    """A clock whose sleep moves it at once, recording each wait: `ride_out` loops with no
    test beside it to advance a `ManualClock` (whose sleep waits for that)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def failing(
    times: int, reply: Exception | None = None
) -> tuple[list[int], Callable[[], Awaitable[str]]]:
    """A step failing `times` times: Redis silent, or answering `reply` (mapped as every
    Redis call's errors are)."""
    calls: list[int] = []

    async def step() -> str:
        calls.append(1)
        if len(calls) <= times:
            if reply is None:
                raise RegistryUnavailable("redis did not answer: connection refused")
            with redis_errors():
                raise reply
        return "done"

    return calls, step


async def test_a_step_is_tried_again_until_redis_answers() -> None:
    clock = Clock()
    calls, step = failing(5)
    assert await ride_out(step, "a look-up", 20.0, clock.sleep, clock) == "done"
    assert len(calls) == 6 and clock.slept == [0.25, 0.5, 1.0, 2.0, 2.0]


async def test_tries_again_are_counted_not_each_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A line a try was a broadcast's every batch a few times a second in an outage: now
    the tries are counted, and said once per 10 s (the first at once, unless another
    test's opened the window)."""
    clock = Clock()
    before = TRIED_AGAIN.total
    with caplog.at_level(logging.WARNING, logger="router.fanout.outages"):
        for what in ("a look-up", "a batch's log entry"):
            await ride_out(failing(5)[1], what, 20.0, clock.sleep, clock)
    assert TRIED_AGAIN.total - before == 10
    assert len(caplog.records) <= 1, caplog.records


async def test_past_its_budget_the_last_error_is_raised() -> None:
    clock = Clock()
    calls, step = failing(1000)
    with pytest.raises(RegistryUnavailable):
        await ride_out(step, "a look-up", 20.0, clock.sleep, clock)
    assert clock.now <= 20.0 and len(calls) == len(clock.slept) + 1 >= 10


async def test_a_not_now_reply_is_ridden_out_like_silence() -> None:
    clock = Clock()
    calls, step = failing(2, redis.exceptions.ReadOnlyError("READONLY a replica"))
    assert await ride_out(step, "a look-up", 20.0, clock.sleep, clock) == "done"
    assert len(calls) == 3


@pytest.mark.parametrize(
    "reply",
    [
        redis.exceptions.ResponseError("WRONGTYPE Operation against a key holding the wrong kind"),
        redis.exceptions.ResponseError("ERR user_script:1: Script attempted to access a key"),
        redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'"),
    ],
)
async def test_a_reply_that_would_come_again_is_raised_at_once(reply: Exception) -> None:
    clock = Clock()
    calls, step = failing(1000, reply)
    with pytest.raises(RegistryRefused) as raised:
        await ride_out(step, "a look-up", 20.0, clock.sleep, clock)
    assert raised.value.__cause__ is reply
    assert len(calls) == 1 and clock.slept == []
