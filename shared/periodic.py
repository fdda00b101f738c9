"""A periodic task: one step every interval, in a task of its own while a block runs.

The one way a background loop is written. A step that raises is logged and the loop
goes on (a loop that died would leave its job undone for the life of the process);
its lines are throttled (`Throttled`): during an outage a loop that fails every
second says so once per `log_every_s`, with the count since. `CancelledError` is
never caught: leaving the block cancels the task and waits for it to end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from shared.clock import AsyncClock, SystemClock
from shared.errors import ImrouteError
from shared.throttled import Throttled

__all__ = ["LOG_EVERY_S", "Periodic", "ticks"]

# A failing loop logs at most one line per this many seconds (with the count since).
LOG_EVERY_S = 10.0


async def ticks(
    interval_s: float, fixed_rate: bool = True, clock: AsyncClock | None = None
) -> AsyncIterator[None]:
    """Once per `interval_s`, forever. `fixed_rate`: a tick every `interval_s` however
    long the caller's work took (after work that overran, the next at once, with no
    catching up); else `interval_s` passes after the caller's work, each time."""
    clock = clock or SystemClock()
    next_at = clock.monotonic()
    while True:
        if fixed_rate:
            next_at += interval_s
            await clock.sleep(max(0.0, next_at - clock.monotonic()))
            next_at = max(next_at, clock.monotonic())
        else:
            await clock.sleep(interval_s)
        yield


class Periodic:
    """`step` every `every_s` in a task named `name`, from entering the block to leaving
    it (an async context manager); or `run()` it where a coroutine is wanted.

    `at_once`: the first step on entering, else after the first interval. `fixed_rate`:
    see `ticks`. A step's `ImrouteError` (an outage) is a warning `"<name>: <error>"`,
    anything else a traceback, on `log`: at most one line per `log_every_s`."""

    def __init__(
        self,
        name: str,
        step: Callable[[], Awaitable[object]],
        every_s: float,
        *,
        log: logging.Logger,
        at_once: bool = True,
        fixed_rate: bool = False,
        log_every_s: float = LOG_EVERY_S,
        clock: AsyncClock | None = None,
    ) -> None:
        self.name = name
        self.every_s = every_s
        self._step = step
        self._log = log
        self._at_once = at_once
        self._fixed_rate = fixed_rate
        self._clock = clock or SystemClock()
        self.failed = Throttled(log_every_s)  # steps that raised, with their log line
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        """Step every interval until cancelled."""
        if self._at_once:
            await self.step()
            _raise_if_cancelling()
        async for _ in ticks(self.every_s, self._fixed_rate, self._clock):
            await self.step()
            _raise_if_cancelling()

    async def step(self) -> None:
        """One step; what it raises (but cancellation) is counted and logged, throttled."""
        try:
            await self._step()
        except Exception as exc:
            since = self.failed.note(self._clock.monotonic())
            if not since:
                return
            more = "" if since == 1 else f" ({since} failures since the last line)"
            if isinstance(exc, ImrouteError):
                self._log.warning("%s: %s%s", self.name, exc, more)
            else:
                self._log.exception("%s failed unexpectedly; going on%s", self.name, more)

    def start(self) -> None:
        """Run in a task of its own until `stop` (what entering the block does)."""
        self.task = asyncio.create_task(self.run(), name=self.name)

    async def __aenter__(self) -> Periodic:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Cancel the task and wait for it to end (at once if it never started)."""
        task, self.task = self.task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            _raise_if_cancelling()  # the caller's own cancellation is not ours to swallow


def _raise_if_cancelling() -> None:
    """Raise CancelledError if this task is being cancelled: a step that swallowed the
    cancellation (some libraries do, mid-command) must not keep the loop going."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
