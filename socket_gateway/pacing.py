"""Periodic work without bursts: rounds at a fixed rate, each round's items in slices
spread over part of its interval (the route refresh, the keepalive round)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

__all__ = ["spread", "ticks"]

T = TypeVar("T")


async def ticks(interval_s: float, fixed_rate: bool = True) -> AsyncIterator[None]:
    """Once per `interval_s`, forever. `fixed_rate`: a tick every `interval_s` however
    long the caller's work took (after work that overran, the next at once, with no
    catching up); else `interval_s` passes after the caller's work, each time."""
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while True:
        if fixed_rate:
            next_at += interval_s
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            next_at = max(next_at, loop.time())
        else:
            await asyncio.sleep(interval_s)
        yield


async def spread(items: Sequence[T], size: int, over_s: float) -> AsyncIterator[Sequence[T]]:
    """`items` in slices of `size`: the first at once, the rest evenly over `over_s`
    (0: a loop turn between slices)."""
    gap = over_s / max(1, -(-len(items) // size))
    for start in range(0, len(items), size):
        if start:
            await asyncio.sleep(gap)
        yield items[start : start + size]
