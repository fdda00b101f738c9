"""When a background loop that died should be restarted, and when to give up on it.

The gateway's bus consumer is one such loop: a bug or an unexpected library error must
not leave the gateway in the fleet, taking clients, while deaf to every broadcast and
multicast. It is restarted with a growing delay; after `max_failures` within `window_s`
the gateway gives up and drains (socket_gateway.app), so its clients move elsewhere.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from shared.backoff import backoff_s
from shared.clock import Clock

__all__ = ["RestartBudget"]


@dataclass(slots=True, eq=False)
class RestartBudget:
    """`failed()`: the delay before the next restart, or None once the budget is spent."""

    clock: Clock
    max_failures: int = 5
    window_s: float = 60.0
    first_delay_s: float = 0.5
    max_delay_s: float = 8.0
    _failures: deque[float] = field(default_factory=deque, init=False, repr=False)

    def failed(self) -> float | None:
        now = self.clock.monotonic()
        failures = self._failures
        failures.append(now)
        while failures and now - failures[0] > self.window_s:
            failures.popleft()
        if len(failures) >= self.max_failures:
            return None
        return backoff_s(len(failures), self.first_delay_s, self.max_delay_s, rand=None)

    @property
    def recent(self) -> int:
        """Failures within the window, as of the last one."""
        return len(self._failures)
