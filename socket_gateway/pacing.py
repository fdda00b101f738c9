"""Periodic work without bursts: each round's items (rounds at a fixed rate, from
shared.periodic) in slices spread over part of its interval (the route refresh, the
keepalive round)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

__all__ = ["spread"]

T = TypeVar("T")


async def spread(items: Sequence[T], size: int, over_s: float) -> AsyncIterator[Sequence[T]]:
    """`items` in slices of `size`: the first at once, the rest evenly over `over_s`
    (0: a loop turn between slices)."""
    gap = over_s / max(1, -(-len(items) // size))
    for start in range(0, len(items), size):
        if start:
            await asyncio.sleep(gap)
        yield items[start : start + size]
