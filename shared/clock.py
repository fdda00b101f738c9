"""Injected clocks: wall time for stored deadlines, monotonic time for timers."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["AsyncClock", "Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock epoch milliseconds (comparable across machines)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin, for intervals in one process."""
        ...


class AsyncClock(Clock, Protocol):
    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` of this clock's monotonic time."""
        ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass
class ManualClock:
    """A clock that moves only when a test moves it."""

    wall_ms: int = 1_700_000_000_000
    mono: float = 0.0
    _sleepers: list[tuple[float, int, asyncio.Future[None]]] = field(
        default_factory=list, repr=False
    )
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
        heapq.heappush(self._sleepers, (self.mono + seconds, next(self._order), waiter))
        await waiter

    def advance(self, seconds: float) -> None:
        """Move time on, waking (in deadline order) every sleeper whose time has come."""
        self.wall_ms += int(seconds * 1000)
        self.mono += seconds
        while self._sleepers and self._sleepers[0][0] <= self.mono + 1e-9:
            _, _, waiter = heapq.heappop(self._sleepers)
            if not waiter.done():
                waiter.set_result(None)
