"""The cycle collector in a long-running process whose long-lived objects arrive after
start-up.

CPython's full collection walks every tracked object in the oldest generation while
holding the GIL. A gateway's connections (about 18 tracked containers each: transport,
protocol, parser generator, buffers) end up there, so with 5000 connections each full
collection stalled the gateway for about 100 ms, and one came every 20-30 s under P2P
load: that was the p99 of a push at 500/s (docs/benchmarks/index.md). `gc.freeze` moves what
exists out of the collector's sight; objects frozen are still freed by reference
counting, but a frozen object caught in a reference cycle stays until it is unfrozen.

`Freezer` therefore freezes every `freeze_s` (what lived that long is likely to live
on), and every `full_s` unfreezes and runs one full collection (one stall, that long
apart) before freezing again, which frees the cycles closed connections left behind.
"""

from __future__ import annotations

import gc
import logging
import time

from shared.clock import SystemClock
from shared.periodic import Periodic

__all__ = ["GEN0_THRESHOLD", "Freezer", "settle"]

log = logging.getLogger(__name__)

# Young collections this many allocations apart (CPython's default is 700): a push or a
# delivery allocates many short-lived objects and few cycles.
GEN0_THRESHOLD = 10_000


def settle(gen0_threshold: int | None = None) -> None:
    """Once a process has started: what start-up built lives as long as the process, so
    it is frozen. `gen0_threshold`: young collections that many allocations apart (the
    push service's GEN0_THRESHOLD); the gateway keeps CPython's 700, as its young
    collections during a connect storm free thousands of cycles each, 10-20 ms at 10,000."""
    gc.collect()
    gc.freeze()
    if gen0_threshold is not None:
        gc.set_threshold(gen0_threshold, *gc.get_threshold()[1:])


class Freezer:
    """Freezes every `freeze_s`; unfreezes for one full collection every `full_s`."""

    def __init__(self, freeze_s: float, full_s: float) -> None:
        self._freeze_s = freeze_s
        self._full_s = full_s
        self.freezes = 0
        self.full_collections = 0

    def step(self, since_full_s: float) -> bool:
        """One round: freeze, after a full collection when `full_s` has passed; whether
        it ran one."""
        full = self._full_s > 0 and since_full_s >= self._full_s
        if full:
            started = time.perf_counter()
            gc.unfreeze()
            freed = gc.collect()
            took_ms = (time.perf_counter() - started) * 1000
            self.full_collections += 1
            log.info("full garbage collection: %d objects freed in %.0f ms", freed, took_ms)
        gc.freeze()
        self.freezes += 1
        return full

    async def run(self) -> None:
        """A step every `freeze_s` until cancelled (none with `freeze_s` <= 0)."""
        if self._freeze_s <= 0:
            return
        clock = SystemClock()
        last_full = clock.monotonic()

        async def tick() -> None:
            nonlocal last_full
            if self.step(clock.monotonic() - last_full):
                last_full = clock.monotonic()

        await Periodic("gc freezer", tick, self._freeze_s, log=log, at_once=False).run()
