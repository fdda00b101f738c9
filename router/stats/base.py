"""The stats store's seam (no Redis): what the dashboard's overview reads."""

from __future__ import annotations

from typing import Protocol

__all__ = ["StatsReads"]


class StatsReads(Protocol):
    @property
    def bucket_ms(self) -> int:
        """Each interval's length."""
        ...

    async def read(self, since_ms: int, until_ms: int) -> list[tuple[int, dict[str, int]]]:
        """Each interval starting in [since_ms, until_ms], oldest first, with its counts."""
        ...
