"""A wrapper of a real Redis client that counts its pipeline round trips, for bounding them."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

__all__ = ["CountingPipelines"]


class CountingPipelines:
    """Counts pipeline round trips made through a real client."""

    def __init__(self, inner: aioredis.Redis) -> None:
        self.inner = inner
        self.executions = 0

    def pipeline(self, transaction: bool = True) -> Any:
        pipe = self.inner.pipeline(transaction=transaction)
        real_execute = pipe.execute

        async def execute(*args: Any, **kwargs: Any) -> Any:
            self.executions += 1
            return await real_execute(*args, **kwargs)

        pipe.execute = execute  # type: ignore[method-assign]
        return pipe

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
