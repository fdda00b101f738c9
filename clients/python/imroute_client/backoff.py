"""Jittered exponential backoff and the Retry-After reading, as pure functions."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Backoff", "retry_after"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """`min_s * factor**attempt`, capped at `max_s`, times a jitter in [0.5, 1.5)."""

    min_s: float = 0.1
    max_s: float = 5.0
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.min_s <= self.max_s:
            raise ValueError(f"backoff needs 0 < min ({self.min_s}) <= max ({self.max_s})")
        if self.factor < 1:
            raise ValueError(f"backoff factor {self.factor} is below 1")

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before retry number `attempt` (0 for the first retry)."""
        # Bound the exponent, so a long outage cannot overflow the float.
        base = min(self.max_s, self.min_s * self.factor ** min(max(attempt, 0), 64))
        # Jitter spreads clients that lost the same gateway at the same moment.
        return min(self.max_s, base * (0.5 + rand()))


def retry_after(value: str | None, backoff: Backoff, rand: Callable[[], float]) -> float | None:
    """Seconds a Retry-After header asks for, clamped to the backoff's range and jittered
    up to 20% so clients told the same number do not return together; None when the
    header is absent or not a number of seconds (an HTTP date is not expected here)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    if not math.isfinite(seconds):  # "nan" and "inf" parse as floats
        return None
    seconds = min(max(seconds, backoff.min_s), backoff.max_s)
    return min(backoff.max_s, seconds * (1 + 0.2 * rand()))
