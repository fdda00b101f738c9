"""CoalescingRouteWriter with an in-memory registry (pure logic)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

import pytest

from router.routes.registry import RouteOp
from router.routes.writer import CoalescingRouteWriter
from shared.errors import RegistryUnavailable


class MemoryRegistry:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.calls: list[list[RouteOp]] = []

    async def apply(self, ops: Sequence[RouteOp]) -> None:
        self.calls.append(list(ops))
        await asyncio.sleep(0.01)
        if self.error:
            raise self.error


async def test_ops_queued_during_a_round_trip_share_the_next_one_in_order() -> None:
    registry = MemoryRegistry()
    writer = CoalescingRouteWriter(cast(Any, registry), max_batch=3)
    await asyncio.gather(
        writer.register("a", "1"),
        writer.unregister("a", "1"),
        writer.register("b", "2"),
        writer.register("c", "3"),
        writer.unregister("b", "2"),
    )
    flat = [(op.register, op.uid) for call in registry.calls for op in call]
    assert flat == [(True, "a"), (False, "a"), (True, "b"), (True, "c"), (False, "b")]
    assert [len(c) for c in registry.calls] == [3, 2]


@pytest.mark.parametrize("error", [RegistryUnavailable("down"), RuntimeError("bug")])
async def test_every_waiter_hears_of_a_failure(error: Exception) -> None:
    writer = CoalescingRouteWriter(cast(Any, MemoryRegistry(error)))
    results = await asyncio.gather(
        *(writer.register(f"u{i}", str(i)) for i in range(4)), return_exceptions=True
    )
    assert all(isinstance(r, RegistryUnavailable) for r in results)
