"""CoalescingRouteWriter with an in-memory registry (pure logic)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

import pytest

from router.routes.registry import RouteOp
from router.routes.writer import CoalescingRouteWriter
from shared.errors import RegistryRefused, RegistryUnavailable, TooManyConnections


class MemoryRegistry:
    def __init__(self, error: Exception | None = None, max_per_user: int = 0) -> None:
        self.error = error
        self.max_per_user = max_per_user
        self.calls: list[list[RouteOp]] = []
        self.routes: dict[str, set[str]] = {}

    async def apply(self, ops: Sequence[RouteOp]) -> list[bool]:
        self.calls.append(list(ops))
        await asyncio.sleep(0.01)
        if self.error:
            raise self.error
        accepted = []
        for op in ops:
            held = self.routes.setdefault(op.uid, set())
            if not op.register:
                held.discard(op.conn_id)
            elif op.new and self.max_per_user and len(held) >= self.max_per_user:
                accepted.append(False)
                continue
            else:
                held.add(op.conn_id)
            accepted.append(True)
        return accepted


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


async def test_only_the_registers_past_the_cap_are_refused() -> None:
    registry = MemoryRegistry(max_per_user=2)
    writer = CoalescingRouteWriter(registry)
    results = await asyncio.gather(
        *(writer.register("a", str(i)) for i in range(4)),
        writer.register("b", "b1"),
        writer.unregister("a", "0"),
        return_exceptions=True,
    )
    refused = [r for r in results if isinstance(r, TooManyConnections)]
    assert [r.limit for r in refused] == [2, 2]
    assert results[4:] == [None, None]
    # The unregister freed a place: the next register of "a" goes in.
    await writer.register("a", "4")
    assert registry.routes["a"] == {"1", "4"}


class RefusingOne(MemoryRegistry):
    """Redis refusing the call of one user's key (it holds another type): the round trip
    raises, though the other calls in it ran."""

    def __init__(self, bad: str) -> None:
        super().__init__()
        self.bad = bad

    async def apply(self, ops: Sequence[RouteOp]) -> list[bool]:
        accepted = await super().apply([op for op in ops if op.uid != self.bad])
        self.calls[-1] = list(ops)  # the call as it was made
        if len(accepted) < len(ops):
            raise RegistryRefused(f"WRONGTYPE {self.bad}")
        return accepted


async def test_a_refused_call_fails_only_its_own_waiter() -> None:
    registry = RefusingOne("b")
    writer = CoalescingRouteWriter(cast(Any, registry))
    first = asyncio.ensure_future(writer.register("first", "0"))
    await asyncio.sleep(0)  # the next ones queue behind it, and go in one batch
    results = await asyncio.gather(
        *(writer.register(u, "1") for u in ("a", "b", "c")), return_exceptions=True
    )
    await first
    assert [type(r) for r in results] == [type(None), RegistryRefused, type(None)]
    assert [len(c) for c in registry.calls] == [1, 3, 1, 1, 1]  # the batch, then one by one
    assert set(registry.routes) == {"first", "a", "c"}
