"""Many concurrent single requests, one batched call: `await c(item)` for each caller,
`fn([items])` for up to `max_batch` of them per round trip, one round trip at a time.

A reconnect storm asks Redis the same small question for thousands of clients; asked
one by one they queue for the connection pool (and time out), asked together they
are one pipeline."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from shared.errors import ImrouteError, RegistryUnavailable

__all__ = ["Coalescer"]

In = TypeVar("In")
Out = TypeVar("Out")


class Coalescer(Generic[In, Out]):
    def __init__(
        self, fn: Callable[[Sequence[In]], Awaitable[Sequence[Out]]], max_batch: int = 200
    ) -> None:
        self._fn = fn
        self._max_batch = max_batch
        self._pending: deque[tuple[In, asyncio.Future[Out]]] = deque()
        self._flusher: asyncio.Task[None] | None = None

    async def __call__(self, item: In) -> Out:
        future: asyncio.Future[Out] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        while self._pending:
            n = min(self._max_batch, len(self._pending))
            batch = [self._pending.popleft() for _ in range(n)]
            try:
                results = await self._fn([item for item, _ in batch])
            except asyncio.CancelledError:
                for _, future in batch:
                    future.cancel()
                raise
            except Exception as exc:  # every waiter hears of it
                error = exc if isinstance(exc, ImrouteError) else RegistryUnavailable(str(exc))
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
            else:
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
