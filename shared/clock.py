"""Injected clocks: wall time for stored deadlines, monotonic time for timers."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock epoch milliseconds (comparable across machines)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin, for intervals in one process."""
        ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


@dataclass
class ManualClock:
    """A clock that moves only when a test moves it."""

    wall_ms: int = 1_700_000_000_000
    mono: float = 0.0

    def now_ms(self) -> int:
        return self.wall_ms

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall_ms += int(seconds * 1000)
        self.mono += seconds
