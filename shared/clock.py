"""Injected clocks: wall time for stored deadlines, monotonic time for timers."""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["AsyncClock", "Cancellable", "Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock epoch milliseconds (comparable across machines)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin, for intervals in one process."""
        ...


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class AsyncClock(Clock, Protocol):
    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` of this clock's monotonic time."""
        ...

    def call_later(self, seconds: float, callback: Callable[[], None]) -> Cancellable:
        """Run `callback` on the event loop once `seconds` have passed."""
        ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def call_later(self, seconds: float, callback: Callable[[], None]) -> Cancellable:
        return asyncio.get_running_loop().call_later(seconds, callback)


@dataclass
class ManualClock:
    """A clock that moves only when a test moves it."""

    wall_ms: int = 1_700_000_000_000
    mono: float = 0.0
    _timers: list[tuple[float, int, _ManualTimer]] = field(default_factory=list, repr=False)
    _order: itertools.count[int] = field(default_factory=itertools.count, repr=False)

    def now_ms(self) -> int:
        return self.wall_ms

    def monotonic(self) -> float:
        return self.mono

    async def sleep(self, seconds: float) -> None:
        """Wait until `advance` has moved the clock `seconds` on (at once if <= 0)."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        waiter = asyncio.get_running_loop().create_future()
        self.call_later(seconds, lambda: None if waiter.done() else waiter.set_result(None))
        await waiter

    def call_later(self, seconds: float, callback: Callable[[], None]) -> Cancellable:
        """Run `callback` when `advance` reaches `seconds` from now, in the context of
        this call (as asyncio's loop does: a timer sees the caller's context vars)."""
        timer = _ManualTimer(callback, contextvars.copy_context())
        heapq.heappush(self._timers, (self.mono + max(0.0, seconds), next(self._order), timer))
        return timer

    def advance(self, seconds: float) -> None:
        """Move time on, firing each timer due on the way at its own time, in order."""
        target = self.mono + seconds
        while self._timers and self._timers[0][0] <= target + 1e-9:
            due, _, timer = heapq.heappop(self._timers)
            self.wall_ms += round((max(due, self.mono) - self.mono) * 1000)
            self.mono = max(due, self.mono)
            if not timer.cancelled:
                timer.context.run(timer.callback)
        self.wall_ms += round((target - self.mono) * 1000)
        self.mono = target


@dataclass
class _ManualTimer:
    callback: Callable[[], None]
    context: contextvars.Context
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True
