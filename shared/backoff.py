"""Exponential backoff with a cap, and equal jitter: the one way a retry waits.

The wait before retry `attempt` (from 1) grows from `base_s` by `factor` each time, at
most `cap_s` (the ceiling); with jitter it is drawn between half the ceiling and all
of it ("equal jitter"). Equal, not full jitter (anywhere from 0 to the ceiling):
full jitter spreads a crowd of retriers a little wider, but lets any one of them come
back at once, and our retriers are often alone (one subscriber, one CLI, one webhook
sender) against a server that just failed; equal jitter keeps half the wait as a floor
and still spreads a crowd over the other half. Without jitter (`rand=None`) the wait is
the ceiling itself, for the few places that must be predictable (a listener's accept
retry, a supervisor's restart).

Pure: the draw is injected (`rand`, in [0, 1)), so tests pass a constant.
"""

from __future__ import annotations

import random
from collections.abc import Callable

__all__ = ["backoff_s", "jittered"]


def backoff_s(
    attempt: int,
    base_s: float,
    cap_s: float,
    *,
    factor: float = 2.0,
    rand: Callable[[], float] | None = random.random,
) -> float:
    """The wait before retry `attempt` (from 1; below 1 counts as 1): `base_s *
    factor ** (attempt - 1)`, at most `cap_s`, then with `rand` between half of that
    and all of it (equal jitter); `rand=None`: no jitter."""
    try:
        ceiling = min(cap_s, base_s * factor ** max(0, attempt - 1))
    except OverflowError:  # a float power past 1e308: long past any cap
        ceiling = cap_s
    return ceiling if rand is None else jittered(ceiling, rand)


def jittered(ceiling_s: float, rand: Callable[[], float] = random.random) -> float:
    """Equal jitter: a wait between half of `ceiling_s` and all of it."""
    return ceiling_s * (0.5 + 0.5 * rand())
