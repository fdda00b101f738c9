"""Limits on what a client sends, sans I/O: the per-connection frame rate.

Time is passed in (monotonic seconds), so the rules are tested without sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FrameRate"]

# Float slack for a bucket drained one frame at a time: `burst` increments of
# 1/rate must still fit in `burst / rate`.
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class FrameRate:
    """At most `rate` frames per second on average and `burst` at once: a token bucket
    of `burst` tokens refilled at `rate` per second, one token per frame."""

    rate: float
    burst: int

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst < 1:
            raise ValueError(f"a frame rate needs rate > 0 and burst >= 1, not {self}")

    def admit(self, tat: float, now: float, frames: int = 1) -> float | None:
        """The bucket's next state once `frames` arrived at `now`, or None when they
        are over the limit (the state is then unchanged: the caller closes).

        The bucket is one float per connection, its theoretical arrival time (GCRA):
        the moment it is full again. A state at or before `now` is a full bucket, so a
        new connection starts from 0.0.
        """
        start = tat if tat > now else now
        after = start + frames / self.rate
        if (after - now) * self.rate > self.burst + _EPSILON:
            return None
        return after
