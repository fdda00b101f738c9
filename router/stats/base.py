"""The stats store's seams (no Redis): what the dashboard's overview reads, and what
dispatch reads of clients' connects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

__all__ = ["CountSums", "StatsReads", "StatsWrites"]


class StatsReads(Protocol):
    @property
    def bucket_ms(self) -> int:
        """Each interval's length."""
        ...

    async def read(self, since_ms: int, until_ms: int) -> list[tuple[int, dict[str, int]]]:
        """Each interval starting in [since_ms, until_ms], oldest first, with its counts."""
        ...


class CountSums(Protocol):
    async def sums(self, since_ms: int, until_ms: int, names: Sequence[str]) -> dict[str, int]:
        """Each of `names` summed over the intervals starting in [since_ms, until_ms]."""
        ...


class StatsWrites(Protocol):
    async def add(self, at_ms: int, counts: Mapping[str, int]) -> None:
        """Add `counts` to the interval holding `at_ms`."""
        ...
