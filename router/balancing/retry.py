"""How often a pinned call is retried on its own gateway, and how long it waits (pure).

A P2P call must reach the gateway the user is connected to, so it is retried only there
(never on "the next server", as Ribbon would for a call any server can take): up to
`max_retries_same` times, backing off exponentially with jitter.
`router.gateway_rpc.client` runs the retries; this only decides the numbers.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from shared.backoff import backoff_s
from shared.errors import ConfigError

__all__ = ["RetryPolicy"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many times a call is retried on its gateway and how long each retry waits.

    Retries back off exponentially from `backoff_s` up to `max_backoff_s`, with equal
    jitter (`shared.backoff`). `jitter` returns a number in [0, 1).
    """

    max_retries_same: int = 0
    backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    jitter: Callable[[], float] = field(default=random.random, repr=False, compare=False)

    def __post_init__(self) -> None:
        value = self.max_retries_same
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"max_retries_same: {value!r} is not a whole number >= 0")
        for name in ("backoff_s", "max_backoff_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name}: {value!r} is not a number of seconds >= 0")
        if self.max_backoff_s < self.backoff_s:
            raise ConfigError(
                f"max_backoff_s: {self.max_backoff_s:g} is below backoff_s {self.backoff_s:g}"
            )

    def backoff(self, retry: int) -> float:
        """The jittered wait before the `retry`-th retry (from 1)."""
        return backoff_s(retry, self.backoff_s, self.max_backoff_s, rand=self.jitter)
