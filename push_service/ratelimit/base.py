"""What a rate limit is, and the seam its store sits behind."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Protocol

from shared.errors import ConfigError

__all__ = ["RateLimit", "RateLimiter"]

_RATE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*/\s*s\s*")


@dataclass(frozen=True, slots=True)
class RateLimit:
    """`per_s` requests a second on average, `burst` at once (GCRA: an emission interval
    of 1/per_s, and a tolerance of burst - 1 intervals)."""

    per_s: float
    burst: int

    @classmethod
    def parse(cls, rate: str, burst: int | None) -> RateLimit:
        """From IMROUTE_RATE_LIMIT (`<n>/s`) and IMROUTE_RATE_BURST (default: one second's
        worth, at least 1). Raises ConfigError naming the variable."""
        match = _RATE.fullmatch(rate)
        per_s = float(match.group(1)) if match else 0.0
        if not match or not 0 < per_s <= 1_000_000:
            raise ConfigError(
                f"IMROUTE_RATE_LIMIT: {rate!r} is not a rate like 100/s (over 0, at most 1000000)"
            )
        return cls(per_s, burst if burst is not None else max(1, math.ceil(per_s)))

    @property
    def interval_us(self) -> int:
        return max(1, round(1_000_000 / self.per_s))

    def describe(self) -> str:
        return f"{self.per_s:g}/s, burst {self.burst}"


class RateLimiter(Protocol):
    """`take(bucket)`: None if the request may go now (and it is counted), else the
    seconds until it may."""

    @property
    def limit(self) -> RateLimit: ...

    async def take(self, bucket: str) -> float | None: ...
