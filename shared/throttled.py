"""A count with a throttled log line (pure: time is passed in, monotonic seconds).

For refusals an attacker can repeat at will: each one is counted, and a log line goes
out at most once per `every_s`, saying how many happened since the previous one, so a
flood of refusals never becomes a flood of log lines.
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
    _line_at: float | None = None

    @property
    def last_line(self) -> float | None:
        """When the last line was let through; None before the first."""
        return self._line_at

    def note(self, now: float, n: int = 1) -> int:
        """Count `n` occurrences at `now`; the number to log (since the last line, these
        included) if a line is due, else 0."""
        self.total += n
        self._unlogged += n
        last = self._line_at
        if last is not None and now - last < self.every_s:
            return 0
        since, self._unlogged = self._unlogged, 0
        self._line_at = now
        return since

    def due_in(self, now: float) -> float | None:
        """Seconds until what was held back since the last line may be said (0: now);
        None when nothing is held back."""
        if not self._unlogged:
            return None
        last = self._line_at
        return 0.0 if last is None else max(0.0, last + self.every_s - now)

    def flush(self, now: float) -> int:
        """What was held back since the last line, once its window has passed (a line
        that says it is then due, as `note` would let one through); else 0. For a timer
        at the window's end, so that a burst that stops is said whole."""
        if self.due_in(now) != 0.0:
            return 0
        since, self._unlogged = self._unlogged, 0
        self._line_at = now
        return since
