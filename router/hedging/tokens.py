"""The hedging token bucket, in integer milli-tokens (pure, thread-safe).

Like Google's clients: it starts empty, a hedge costs one token, and each successful
publish adds `refill_ratio` tokens, up to `max_tokens`. Integer milli-tokens keep the
arithmetic exact: ten refills of 0.1 make exactly one token.
"""

from __future__ import annotations

import threading

__all__ = ["MILLI", "TokenBucket"]

MILLI = 1000


class TokenBucket:
    def __init__(self, max_tokens: int, refill_ratio: float) -> None:
        self._capacity = max_tokens * MILLI
        self._refill = round(refill_ratio * MILLI)
        self._milli = 0
        self._lock = threading.Lock()

    @property
    def milli_tokens(self) -> int:
        return self._milli

    @property
    def tokens(self) -> float:
        return self._milli / MILLI

    def try_acquire(self) -> bool:
        """Take one token for a hedge; False (and nothing taken) when under one is left."""
        with self._lock:
            if self._milli < MILLI:
                return False
            self._milli -= MILLI
            return True

    def refill(self) -> None:
        """Credit one successful publish."""
        with self._lock:
            self._milli = min(self._capacity, self._milli + self._refill)
