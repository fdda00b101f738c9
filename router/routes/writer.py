"""Coalesces the gateway's concurrent route writes into pipelined round trips.

When thousands of clients connect or leave at once, each handler still awaits its
own register/unregister, but the writes travel to Redis together: one pipeline of
up to `max_batch` operations per round trip, in arrival order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from router.routes.base import RouteOp, apply_apart
from shared.errors import RegistryUnavailable, TooManyConnections

__all__ = ["CoalescingRouteWriter", "RouteWrites"]


class RouteWrites(Protocol):
    """What the writer needs of a registry: its batch write and the per-user cap."""

    @property
    def max_per_user(self) -> int: ...
    async def apply(self, ops: Sequence[RouteOp]) -> list[bool]: ...


class CoalescingRouteWriter:
    def __init__(self, registry: RouteWrites, max_batch: int = 1000) -> None:
        self._registry = registry
        self._max_batch = max_batch
        self._pending: deque[tuple[RouteOp, asyncio.Future[None]]] = deque()
        self._flusher: asyncio.Task[None] | None = None

    async def register(self, uid: str, conn_id: str) -> None:
        """A new connection's route; TooManyConnections when its user is at the cap."""
        await self._submit(RouteOp(True, uid, conn_id, new=True))

    async def unregister(self, uid: str, conn_id: str) -> None:
        await self._submit(RouteOp(False, uid, conn_id))

    async def _submit(self, op: RouteOp) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((op, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="route-writer")
        await future

    async def _flush(self) -> None:
        # Whatever queued up while a round trip was in flight goes in the next one.
        while self._pending:
            batch = [
                self._pending.popleft() for _ in range(min(self._max_batch, len(self._pending)))
            ]
            await self._write(batch)

    async def _write(self, batch: list[tuple[RouteOp, asyncio.Future[None]]]) -> None:
        try:
            # A refused op (its user's key holds another type) fails only its own waiter.
            results = await apply_apart(self._registry.apply, [op for op, _ in batch])
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:  # every waiter hears of it, whatever it is
            _fail(batch, exc)
            return
        for (op, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            elif result:
                future.set_result(None)
            else:
                future.set_exception(TooManyConnections(op.uid, self._registry.max_per_user))

    async def aclose(self) -> None:
        """Wait for writes already queued (a shutdown must not drop unregisters)."""
        if self._flusher is not None:
            with contextlib.suppress(Exception):
                await self._flusher


def _fail(batch: Sequence[tuple[RouteOp, asyncio.Future[None]]], exc: Exception) -> None:
    error = exc if isinstance(exc, RegistryUnavailable) else RegistryUnavailable(str(exc))
    for _, future in batch:
        if not future.done():
            future.set_exception(error)
