"""A keepalive round is spread over its share of the interval in slices, not one burst
of pings (and of pongs back) for every connection at once."""

from __future__ import annotations

import asyncio
import time

from socket_gateway.ws.conn import PING_SLICE, ping_round


class Pinged:
    def __init__(self, at: list[float]) -> None:
        self._at = at

    def _keepalive(self) -> None:
        self._at.append(time.monotonic())


async def test_a_round_is_sliced_and_spread() -> None:
    at: list[float] = []
    conns = [Pinged(at) for _ in range(2 * PING_SLICE + 50)]  # three slices
    started = time.monotonic()
    await ping_round(conns, spread_s=0.3)  # type: ignore[arg-type]
    assert len(at) == len(conns)
    firsts = [at[0], at[PING_SLICE], at[2 * PING_SLICE]]
    assert firsts[0] - started < 0.05
    assert 0.08 <= firsts[1] - firsts[0] < 0.2 and 0.08 <= firsts[2] - firsts[1] < 0.2
    assert at[PING_SLICE - 1] - at[0] < 0.05  # a slice goes together


async def test_without_a_spread_slices_are_a_loop_turn_apart() -> None:
    at: list[float] = []
    turns = 0

    async def count() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    counter = asyncio.create_task(count())
    await asyncio.sleep(0)
    before = turns
    await ping_round([Pinged(at) for _ in range(3 * PING_SLICE)])  # type: ignore[arg-type]
    counter.cancel()
    assert len(at) == 3 * PING_SLICE and turns - before >= 2
    assert at[-1] - at[0] < 0.1
