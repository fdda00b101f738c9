"""The HTTP edge's stores in memory: idempotency keys and rate buckets, behind the
router's seams (see `router.testing.stores`)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from push_service.idempotency.base import Answer, Claimed, Mismatch, Outcome, Running
from push_service.ratelimit.base import RateLimit
from shared.clock import Clock

__all__ = ["MemoryIdempotencyStore", "MemoryRateLimiter"]


@dataclass
class _Entry:
    fingerprint: str
    token: str
    answer: Answer | None = None


class MemoryIdempotencyStore:
    """Idempotency keys in a dict: claimed, then completed with an answer or released."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], _Entry] = {}

    async def claim(self, scope: str, key: str, fingerprint: str) -> Outcome:
        entry = self.entries.get((scope, key))
        if entry is None:
            token = secrets.token_hex(16)
            self.entries[scope, key] = _Entry(fingerprint, token)
            return Claimed(token)
        if entry.fingerprint != fingerprint:
            return Mismatch()
        return Running() if entry.answer is None else entry.answer

    async def complete(self, scope: str, key: str, token: str, answer: Answer) -> bool:
        entry = self.entries.get((scope, key))
        if entry is None or entry.token != token:
            return False
        entry.answer = answer
        return True

    async def release(self, scope: str, key: str, token: str) -> None:
        entry = self.entries.get((scope, key))
        if entry is not None and entry.token == token and entry.answer is None:
            del self.entries[scope, key]


class MemoryRateLimiter:
    """GCRA per bucket, as the Redis one, on the given clock's monotonic time."""

    def __init__(self, limit: RateLimit, clock: Clock) -> None:
        self._limit = limit
        self._clock = clock
        self._tat: dict[str, float] = {}  # bucket -> theoretical arrival time (s)

    @property
    def limit(self) -> RateLimit:
        return self._limit

    async def take(self, bucket: str) -> float | None:
        now = self._clock.monotonic()
        interval = self._limit.interval_us / 1_000_000
        tat = max(self._tat.get(bucket, now), now)
        wait = tat - (self._limit.burst - 1) * interval - now
        if wait > 0:
            return wait
        self._tat[bucket] = tat + interval
        return None
