"""Lua scripts run by SHA, one at a time or many in a pipeline, on Redis or Redis Cluster.

redis-py's `Script` objects do not go through a cluster pipeline (it refuses evalsha),
so calls are sent as `EVALSHA sha n key...`, which the cluster pipeline routes by the
first key. A Redis that restarted or failed over has lost its script cache: the call
fails with NoScriptError before anything ran, the scripts are loaded and it runs again.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from redis.exceptions import NoScriptError

from router.redis.autopipe import AutoPipeline
from router.redis.client import RedisClient

__all__ = ["Script", "ScriptRunner"]

T = TypeVar("T")

AUTO_MANY = 16  # more calls than this go in a pipeline of their own


class Script:
    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    def args(self, keys: Sequence[str], *argv: Any) -> tuple[Any, ...]:
        return ("EVALSHA", self.sha, len(keys), *keys, *argv)


class ScriptRunner:
    """Runs calls of its scripts (`Script.args`) alone or pipelined."""

    def __init__(
        self, redis: RedisClient, scripts: Sequence[Script], auto: AutoPipeline | None = None
    ) -> None:
        """`auto`: send single calls through it (their round trips shared with other
        tasks' commands), standalone Redis only."""
        self._redis = redis
        self._scripts = tuple(scripts)
        self._execute = auto.execute if auto is not None else redis.execute_command
        self._auto = auto

    async def _run(self, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except NoScriptError:
            # Nothing ran (every call of a pipeline fails alike): load them, run again.
            for script in self._scripts:
                await self._redis.script_load(script.text)
            return await call()

    async def one(self, args: tuple[Any, ...]) -> Any:
        return await self._run(lambda: self._execute(*args))

    async def many(self, calls: Sequence[tuple[Any, ...]]) -> list[Any]:
        if len(calls) == 1:
            return [await self.one(calls[0])]
        auto = self._auto
        if auto is not None:
            if len(calls) <= AUTO_MANY:
                # Issued together, they share one round trip (with other tasks' commands).
                return list(
                    await self._run(lambda: asyncio.gather(*(auto.execute(*a) for a in calls)))
                )
            # Many: packed and parsed at once, in a round trip of their own.
            return await self._run(lambda: auto.execute_many(calls))

        async def go() -> list[Any]:
            pipe = self._redis.pipeline(transaction=False)
            for args in calls:
                pipe.execute_command(*args)
            return list(await pipe.execute())

        return await self._run(go)
