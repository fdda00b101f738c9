"""Limits on what a client sends, sans I/O: the per-connection frame rate, and the
counts (with throttled log lines) of the connections a limit refused or closed.

Time is passed in (monotonic seconds), so the rules are tested without sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.throttled import Throttled

__all__ = ["FrameRate", "LimitCounts"]

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


@dataclass(slots=True)
class LimitCounts:
    """What the client limits closed (frame rate) or refused (per-user cap): counts for
    /metrics, each with its throttled log line."""

    # connections closed 1008 for sending frames faster than their FrameRate
    frame_rate: Throttled = field(default_factory=Throttled)
    # new connections closed 4429 because their user was at the per-user cap
    user_cap: Throttled = field(default_factory=Throttled)
