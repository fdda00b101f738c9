"""Reading a bus subscription in tests: the next n messages, or none for a while; and
a Redis Streams bus with a subscription that holds all published from its start."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

import pytest

from router.bus import BROADCAST, Received, RedisStreamsBus

__all__ = ["assert_quiet", "streams_subscribed", "summary", "take"]


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


@asynccontextmanager
async def streams_subscribed(
    redis_url: str, prefix: str, group: str = "gw1", **options: Any
) -> AsyncIterator[tuple[RedisStreamsBus, AsyncIterator[Received]]]:
    """A Redis Streams bus (`options`: its own) and `group`'s subscription to broadcast,
    its consumer group made first (`prepare`): it holds all published from then on."""
    async with RedisStreamsBus(redis_url, prefix, **options) as bus:
        await bus.prepare([BROADCAST], group)
        async with aclosing(bus.subscribe([BROADCAST], group)) as messages:
            yield bus, messages
