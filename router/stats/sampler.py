"""Each process's part: every second, what its counters moved by (and its latency
histogram) is added to the store. Counts that could not be written are kept and added
with the next ones, so an outage loses none of them (they land an interval late)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping

from router.stats.base import StatsWrites
from router.stats.latency import LatencyHistogram
from shared.clock import Clock
from shared.errors import ImrouteError

__all__ = ["StatsSampler", "sampling"]

log = logging.getLogger(__name__)

LOG_EVERY_S = 60.0


class StatsSampler:
    def __init__(
        self,
        store: StatsWrites,
        clock: Clock,
        counters: Callable[[], Mapping[str, int]],
        latency: LatencyHistogram | None = None,
        interval_s: float = 1.0,
    ) -> None:
        """`counters`: the process's cumulative counts by name (read once a second)."""
        self._store = store
        self._clock = clock
        self._counters = counters
        self._latency = latency
        self._interval_s = interval_s
        self._last: dict[str, int] = dict(counters())
        self._pending: dict[str, int] = {}
        self.failed = 0  # writes that failed (their counts went with a later one)
        self._logged_at = float("-inf")

    def _take(self) -> dict[str, int]:
        now = dict(self._counters())
        counts = self._pending
        for name, value in now.items():
            moved = value - self._last.get(name, 0)
            if moved < 0:  # its counter started again (a gateway forgotten, then back)
                moved = value
            if moved:
                counts[name] = counts.get(name, 0) + moved
        self._last = now
        if self._latency is not None:
            for name, n in self._latency.take().items():
                counts[name] = counts.get(name, 0) + n
        self._pending = {}
        return counts

    async def flush(self) -> None:
        counts = self._take()
        if not counts:
            return
        try:
            await self._store.add(self._clock.now_ms(), counts)
        except ImrouteError as exc:
            self.failed += 1
            for name, n in counts.items():  # with the next ones
                self._pending[name] = self._pending.get(name, 0) + n
            now = self._clock.monotonic()
            if now - self._logged_at >= LOG_EVERY_S:
                self._logged_at = now
                log.warning("could not write the live stats (kept for later): %s", exc)

    async def run(self) -> None:
        """Flush every interval until cancelled (then once more)."""
        try:
            while True:
                await asyncio.sleep(self._interval_s)
                await self.flush()
        finally:
            await asyncio.shield(self._final())

    async def _final(self) -> None:
        try:
            await self.flush()
        except Exception:  # shutting down: Redis may be gone already
            log.debug("last stats flush failed", exc_info=True)


@contextlib.asynccontextmanager
async def sampling(sampler: StatsSampler) -> AsyncIterator[StatsSampler]:
    """`sampler.run()` in a task for the block's lifetime (a last flush at its end)."""
    task = asyncio.create_task(sampler.run(), name="live-stats")
    try:
        yield sampler
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
