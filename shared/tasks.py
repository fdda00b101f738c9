"""Tasks a component starts and does not await: the one way they are kept and ended.

asyncio holds only a weak reference to a running task, so one that nobody holds can be
collected half-way; and a task whose error nobody retrieves says so late, at garbage
collection, if at all. A `Background` holds each task until it ends, logs a failure
where it happens (each task handles the errors it expects: what reaches here is a bug,
logged with its traceback on the owner's logger), and ends them together at close:
`cancel()` for work that may stop half-way (a retry whose message waits in an inbox),
`drain()` for work that must finish (an answer being kept, a round trip whose callers
wait), bounded by a timeout where a shutdown must not hang.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

__all__ = ["Background"]


class Background:
    """Tasks started by `spawn`, each kept until it ends; `what` names them in the line
    logged on `log` when one fails ("<what> failed", with the traceback)."""

    __slots__ = ("_log", "_tasks", "_what")

    def __init__(self, what: str, log: logging.Logger) -> None:
        self._what = what
        self._log = log
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        """Run `work` in a task of its own, kept until it ends."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._log.error("%s failed", self._what, exc_info=exc)

    def __len__(self) -> int:
        return len(self._tasks)

    async def drain(self, timeout_s: float | None = None, floor_s: float = 0.0) -> int:
        """Wait until every task ended, those started meanwhile too; or, past
        `timeout_s`, return how many still run (0: all ended). The tasks started while
        earlier ones were awaited get at least `floor_s`, past the timeout too (an
        unregister that follows a register which ended at the last moment)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while self._tasks:
            left = None if deadline is None else max(floor_s, deadline - loop.time())
            if left is not None and left <= 0:
                break
            _, pending = await asyncio.wait(set(self._tasks), timeout=left)
            if pending:
                break
        return len(self._tasks)

    async def cancel(self) -> None:
        """Cancel every task, those started meanwhile too, and wait until they ended."""
        while self._tasks:
            tasks = set(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
