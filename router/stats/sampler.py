"""Each process's part: every second, what its counters moved by (and its latency
histogram) is added to the store. Counts that could not be written are kept and added
with the next ones, so an outage loses none of them (they land an interval late)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

from router.stats.base import StatsWrites
from router.stats.latency import LatencyHistogram
from shared.clock import Clock
from shared.errors import ImrouteError
from shared.periodic import Periodic
from shared.throttled import ThrottledLine

__all__ = ["StatsSampler", "sampling"]

log = logging.getLogger(__name__)

LOG_EVERY_S = 60.0


@dataclass(slots=True, eq=False)
class StatsSampler:
    """`counters`: the process's cumulative counts by name (read once a second)."""

    store: StatsWrites
    clock: Clock
    counters: Callable[[], Mapping[str, int]]
    latency: LatencyHistogram | None = None
    interval_s: float = 1.0
    _last: dict[str, int] = field(init=False, repr=False)
    _pending: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    # Writes that failed (their counts went with a later one).
    failed: int = field(default=0, init=False)
    _line: ThrottledLine = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._line = ThrottledLine(
            log,
            "could not write the live stats (kept for later): %(exc)s",
            every_s=LOG_EVERY_S,
            now=self.clock.monotonic,
        )
        self._last = dict(self.counters())

    def _take(self) -> dict[str, int]:
        now = dict(self.counters())
        counts = self._pending
        for name, value in now.items():
            moved = value - self._last.get(name, 0)
            if moved < 0:  # its counter started again (a gateway forgotten, then back)
                moved = value
            if moved:
                counts[name] = counts.get(name, 0) + moved
        self._last = now
        if self.latency is not None:
            for name, n in self.latency.take().items():
                counts[name] = counts.get(name, 0) + n
        self._pending = {}
        return counts

    async def flush(self) -> None:
        counts = self._take()
        if not counts:
            return
        try:
            await self.store.add(self.clock.now_ms(), counts)
        except BaseException as exc:
            # Kept, with the next ones: an outage's, and a write cancelled mid-way (a
            # shutdown: the final flush writes them, where they were lost).
            for name, n in counts.items():
                self._pending[name] = self._pending.get(name, 0) + n
            if not isinstance(exc, ImrouteError):
                raise
            self.failed += 1
            self._line.note(exc=exc)

    def periodic(self) -> Periodic:
        """Flushing every interval (the first after one)."""
        # At a fixed rate: a flush that slipped would now and then leave a bucket of the
        # dashboard's two seconds with one flush where it had two (a dip to half).
        return Periodic(
            "live stats", self.flush, self.interval_s, log=log, at_once=False, fixed_rate=True
        )

    async def final(self) -> None:
        """The last flush, at shutdown."""
        try:
            await self.flush()
        except Exception:  # shutting down: Redis may be gone already
            log.debug("last stats flush failed", exc_info=True)


@contextlib.asynccontextmanager
async def sampling(sampler: StatsSampler) -> AsyncIterator[StatsSampler]:
    """A flush every interval for the block's lifetime, and a last one at its end."""
    try:
        async with sampler.periodic():
            yield sampler
    finally:
        await asyncio.shield(sampler.final())
