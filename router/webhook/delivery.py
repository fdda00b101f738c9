"""What a webhook POST's outcome means, and how long to wait before trying again (pure)."""

from __future__ import annotations

import enum
import random
from collections.abc import Callable

from shared.backoff import backoff_s as _backoff_s

__all__ = ["Outcome", "backoff_s", "outcome_of"]

BACKOFF_BASE_S = 0.5


class Outcome(enum.Enum):
    SENT = "sent"  # 2xx: acknowledged, done
    RETRY = "retry"  # 5xx, 408, 429, a timeout or a connection error: try again later
    DROP = "drop"  # any other status (4xx, 3xx): the receiver refuses; counted, logged, dropped


def outcome_of(status: int | None) -> Outcome:
    """`status` None: no answer (timeout, refused or broken connection)."""
    if status is None or status >= 500 or status in (408, 429):
        return Outcome.RETRY
    if 200 <= status < 300:
        return Outcome.SENT
    # Redirects are not followed: a signed POST re-sent elsewhere is the receiver's
    # misconfiguration to fix, and retrying would not fix it.
    return Outcome.DROP


def backoff_s(failures: int, cap_s: float, rand: Callable[[], float] = random.random) -> float:
    """Exponential from BACKOFF_BASE_S, capped at `cap_s`, with equal jitter
    (`shared.backoff`) so several senders retrying together spread out."""
    return _backoff_s(failures, BACKOFF_BASE_S, cap_s, rand=rand)
