"""The one way Lua runs here: scripts kept as `.lua` files beside the store that runs them,
sent by SHA, one at a time or many in a pipeline, on Redis or Redis Cluster.

A store reads its scripts once, at import (`Script.load(__package__, "name")`: the file
`name.lua` of the store's package, which the wheel ships). A script that needs another's
code takes that one's text first (several names), or as a local function (`as_function`).

redis-py's `Script` objects do not go through a cluster pipeline (it refuses evalsha),
and in a pipeline they add a SCRIPT EXISTS round trip, so calls are sent as
`EVALSHA sha n key...`, which the cluster pipeline routes by the first key. A Redis that
restarted or failed over has lost its script cache: the call fails with NoScriptError
before anything ran, the runner's scripts are loaded and it runs again. Redis errors
leave as redis-py raised them: each store maps them into ours.

On Redis Cluster a call is not sent again once it may have reached Redis (redis-py
would send one whose reply timed out again, and a script that appends would append
twice): the cluster client sends EVALSHA as `router.redis.client.execute_once` does.
A pipeline's own retry still may (`many`; docs/operations/failure-modes.md).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from importlib import resources
from typing import Any, TypeVar

from redis.client import NEVER_DECODE
from redis.exceptions import NoScriptError

from router.redis.autopipe import AutoPipeline
from router.redis.client import RedisClient

__all__ = ["Script", "ScriptRunner", "as_function", "lua"]

T = TypeVar("T")

_NEVER_DECODE = {NEVER_DECODE: True}  # redis-py's option: leave this reply in bytes
AUTO_MANY = 16  # more calls than this go in a pipeline of their own


def lua(package: str, name: str) -> str:
    """The text of `<name>.lua` in `package`'s folder."""
    return resources.files(package).joinpath(f"{name}.lua").read_text(encoding="utf-8")


def as_function(name: str, text: str) -> str:
    """The script `text` as a local function `name(KEYS, ARGV)` of the script after it,
    whose body sees the keys and arguments it is called with, not the caller's."""
    return f"local function {name}(KEYS, ARGV)\n{text}end\n"


class Script:
    """One script's text and SHA; `args` makes a call of it for a `ScriptRunner`."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    @classmethod
    def load(cls, package: str, *names: str, prelude: str = "") -> Script:
        """`prelude`, then the named `.lua` files of `package`, as one script."""
        return cls(prelude + "".join(lua(package, name) for name in names))

    def args(self, keys: Sequence[str], *argv: Any) -> tuple[Any, ...]:
        return ("EVALSHA", self.sha, len(keys), *keys, *argv)


class ScriptRunner:
    """Runs calls of its scripts (`Script.args`) alone or pipelined; a pipeline may
    carry plain commands (`("HDEL", key, field)`) among them."""

    def __init__(
        self, redis: RedisClient, scripts: Sequence[Script], auto: AutoPipeline | None = None
    ) -> None:
        """`scripts`: all that its calls run (loaded together when Redis lost them).
        `auto`: send single calls through it (their round trips shared with other
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
            await self._load()
            return await call()

    async def _load(self) -> None:
        for script in self._scripts:
            await self._redis.script_load(script.text)

    async def run(self, script: Script, keys: Sequence[str], *argv: Any) -> Any:
        """One call of `script`: its reply."""
        return await self.one(script.args(keys, *argv))

    async def one(self, args: tuple[Any, ...]) -> Any:
        return await self._run(lambda: self._execute(*args))

    async def raw(self, args: tuple[Any, ...]) -> Any:
        """`one`, its reply as Redis sent it (bytes, not decoded): binary values, such as
        a stream's batches, which are not text."""
        return await self._run(lambda: self._redis.execute_command(*args, **_NEVER_DECODE))

    async def many(self, calls: Sequence[tuple[Any, ...]]) -> list[Any]:
        if len(calls) == 1:
            return [await self.one(calls[0])]
        auto = self._auto
        if auto is not None:
            if len(calls) <= AUTO_MANY:
                # Issued together, they share one round trip (with other tasks' commands).
                return await self.soon(calls)
            # Many: packed and parsed at once, in a round trip of their own.
            return await self._run(lambda: auto.execute_many(calls))

        replies = await self._pipelined(calls)
        lost = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if lost:
            # A node that lost its scripts (on a Cluster, a primary that failed over or
            # restarted; the others ran theirs): only its calls run again, as a script
            # that appends must not run twice.
            await self._load()
            again = await self._pipelined([calls[i] for i in lost])
            for i, reply in zip(lost, again, strict=True):
                replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply  # the first error, once every call is in, as a pipeline's
        return replies

    async def _pipelined(self, calls: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Each call's reply or error, in one pipeline (a Cluster's: one per node)."""
        pipe = self._redis.pipeline(transaction=False)
        for args in calls:
            pipe.execute_command(*args)
        return list(await pipe.execute(raise_on_error=False))

    def soon(self, calls: Sequence[tuple[Any, ...]]) -> Awaitable[list[Any]]:
        """`many`, sent now: through the auto-pipeline the calls join this loop turn's
        round trip before anything is awaited, so the caller can await another command
        of the same turn first, with no task to run this one beside it; otherwise a task
        runs `many`. The replies (or the error) when awaited."""
        auto = self._auto
        if auto is None or len(calls) > AUTO_MANY:
            return asyncio.ensure_future(self.many(calls))
        return self._replies(auto, calls, [auto.submit(*args) for args in calls])

    async def _replies(
        self,
        auto: AutoPipeline,
        calls: Sequence[tuple[Any, ...]],
        futures: Sequence[asyncio.Future[Any]],
    ) -> list[Any]:
        try:
            return await _replies(futures)
        except NoScriptError:
            # Nothing ran (every call fails alike): load them, submit them again.
            await self._load()
            return await _replies([auto.submit(*args) for args in calls])


async def _replies(futures: Sequence[asyncio.Future[Any]]) -> list[Any]:
    """Each submitted call's reply (no task each, as gather would make), or the first
    error, once every reply is in."""
    replies: list[Any] = []
    first: BaseException | None = None
    for future in futures:
        try:
            replies.append(await future)
        except Exception as exc:  # each one's error retrieved; the first raised
            if first is None:
                first = exc
    if first is not None:
        raise first
    return replies
