"""A count with a throttled log line, sans I/O: how every refusal is reported.

Time is passed in (monotonic seconds), so it is tested without sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Throttled"]


@dataclass(slots=True)
class Throttled:
    """Counts occurrences of one kind and lets a log line through at most once per
    `every_s`, reporting how many happened since the previous line."""

    every_s: float = 10.0
    total: int = 0
    _unlogged: int = 0
    _next_line: float = float("-inf")

    def note(self, now: float) -> int:
        """Count one occurrence at `now`; the number to log if a line is due, else 0."""
        self.total += 1
        self._unlogged += 1
        if now < self._next_line:
            return 0
        since, self._unlogged = self._unlogged, 0
        self._next_line = now + self.every_s
        return since
