"""A push job's Redis steps ride out a Redis that cannot answer for a while (a Cluster
failover, a restart), then give up with the last error: time and sleep injected."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from router.fanout.outages import ride_out
from shared.errors import RegistryUnavailable


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def failing(times: int) -> tuple[list[int], Callable[[], Awaitable[str]]]:
    calls: list[int] = []

    async def step() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise RegistryUnavailable("redis did not answer: connection refused")
        return "done"

    return calls, step


async def test_a_step_is_tried_again_until_redis_answers() -> None:
    clock = Clock()
    calls, step = failing(5)
    assert await ride_out(step, "a look-up", 20.0, clock.sleep, clock) == "done"
    assert len(calls) == 6 and clock.slept == [0.25, 0.5, 1.0, 2.0, 2.0]


async def test_past_its_budget_the_last_error_is_raised() -> None:
    clock = Clock()
    calls, step = failing(1000)
    with pytest.raises(RegistryUnavailable):
        await ride_out(step, "a look-up", 20.0, clock.sleep, clock)
    assert clock.now <= 20.0 and len(calls) == len(clock.slept) + 1 >= 10
