"""Reading a bus subscription in tests: the next n messages, or none for a while."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from router.bus import Received

__all__ = ["assert_quiet", "summary", "take"]


async def take(messages: AsyncIterator[Received], n: int, timeout: float = 3.0) -> list[Received]:
    async with asyncio.timeout(timeout):
        return [await anext(messages) for _ in range(n)]


async def assert_quiet(messages: AsyncIterator[Received], wait: float = 0.2) -> None:
    """Nothing more arrives; this ends the iteration, so call it last."""
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(wait):
            await anext(messages)


def summary(received: list[Received]) -> list[tuple[str, bytes, dict[str, str]]]:
    # The contract promises no order, so compare sorted.
    return sorted((r.topic, r.data, dict(r.attributes)) for r in received)
