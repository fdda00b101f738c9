"""What a webhook POST's outcome means, and how long to wait before trying again (pure)."""

from __future__ import annotations

import enum

__all__ = ["Outcome", "outcome_of"]

BACKOFF_BASE_S = 0.5  # a failed POST's first wait (shared.backoff: doubling, equal jitter)


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
