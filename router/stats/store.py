"""The fleet's counts in Redis: one hash per interval (`BUCKET_MS`), each process adding
what it counted (HINCRBY), kept `KEEP_MS`; read back interval by interval."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from shared.keys import KeySchema

__all__ = ["BUCKET_MS", "KEEP_MS", "RedisStatsStore"]

BUCKET_MS = 2000
KEEP_MS = 11 * 60 * 1000  # the dashboard shows ten minutes


@dataclass(slots=True, eq=False)
class RedisStatsStore:
    redis: RedisClient
    keys: KeySchema
    bucket_ms: int = BUCKET_MS
    keep_ms: int = KEEP_MS

    def start_of(self, at_ms: int) -> int:
        return at_ms - at_ms % self.bucket_ms

    @translate_errors
    async def add(self, at_ms: int, counts: Mapping[str, int]) -> None:
        """Add `counts` to the interval holding `at_ms` (one round trip)."""
        key = self.keys.stats(self.start_of(at_ms))
        pipe = self.redis.pipeline(transaction=False)
        for name, n in counts.items():
            pipe.hincrby(key, name, n)
        pipe.pexpire(key, self.keep_ms)
        await pipe.execute()

    @translate_errors
    async def read(self, since_ms: int, until_ms: int) -> list[tuple[int, dict[str, int]]]:
        """Each interval starting in [since_ms, until_ms], oldest first, with its counts
        (empty where nothing was counted)."""
        starts = list(range(self.start_of(since_ms), until_ms + 1, self.bucket_ms))
        pipe = self.redis.pipeline(transaction=False)
        for start in starts:
            pipe.hgetall(self.keys.stats(start))
        replies: list[Any] = await pipe.execute()
        return [
            (start, {str(k): int(v) for k, v in (reply or {}).items()})
            for start, reply in zip(starts, replies, strict=True)
        ]

    @translate_errors
    async def sums(self, since_ms: int, until_ms: int, names: Sequence[str]) -> dict[str, int]:
        """Each of `names` summed over the intervals starting in [since_ms, until_ms]
        (only those fields are read: one HMGET per interval, one round trip)."""
        if not names:
            return {}
        starts = range(self.start_of(since_ms), until_ms + 1, self.bucket_ms)
        pipe = self.redis.pipeline(transaction=False)
        for start in starts:
            pipe.hmget(self.keys.stats(start), list(names))
        replies: list[Any] = await pipe.execute()
        out = dict.fromkeys(names, 0)
        for reply in replies:
            for name, value in zip(names, reply or (), strict=False):
                if value is not None:
                    out[name] += int(value)
        return out
