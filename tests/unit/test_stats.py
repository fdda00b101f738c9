"""The dashboard's figures, pure parts: latency buckets and percentiles, per-interval
rates, and the sampler's deltas (with a store that fails once)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from router.stats.latency import LatencyHistogram, bucket_of, percentile, upper_ms
from router.stats.sampler import StatsSampler
from router.stats.series import points, totals
from shared.clock import ManualClock
from shared.errors import RegistryUnavailable


def test_a_percentile_reads_within_a_bucket_of_the_truth() -> None:
    h = LatencyHistogram()
    for ms in range(1, 1001):
        h.add(ms)
    fields = h.take()
    assert sum(fields.values()) == 1000 and h.take() == {}
    p50, p99 = percentile(fields, 0.5), percentile(fields, 0.99)
    assert p50 is not None and p99 is not None
    assert 500 <= p50 <= 500 * 1.2 and 990 <= p99 <= 990 * 1.2
    assert percentile({}, 0.5) is None
    assert bucket_of(0) == 0 and bucket_of(-5) == 0 and bucket_of(10**9) == bucket_of(10**12)
    assert all(upper_ms(bucket_of(ms)) >= ms for ms in (1, 7, 100, 12_345))


def test_points_are_rates_per_second_and_totals_leave_latency_out() -> None:
    buckets = [(0, {"p2p": 10, "acked": 4, "l10": 3}), (2000, {})]
    first, second = points(buckets, 2000)
    assert (first["t"], first["p2p"], first["acked"], first["batch"]) == (0, 5.0, 2.0, 0.0)
    assert first["p50"] == upper_ms(10) and second["p50"] is None
    assert totals(buckets) == {"p2p": 10, "acked": 4}


class Store:
    def __init__(self) -> None:
        self.added: list[dict[str, int]] = []
        self.fail = 0

    async def add(self, at_ms: int, counts: Mapping[str, int]) -> None:
        if self.fail:
            self.fail -= 1
            raise RegistryUnavailable("redis down")
        self.added.append(dict(counts))


async def test_the_sampler_writes_what_moved_and_keeps_what_it_could_not_write() -> None:
    counts = {"p2p": 5, "calls:gw1": 3}
    store = Store()
    latency = LatencyHistogram()
    sampler = StatsSampler(store, ManualClock(), lambda: counts, latency)  # type: ignore[arg-type]
    await sampler.flush()
    assert store.added == []  # nothing moved since it started
    counts.update(p2p=7)
    latency.add(3.0, 2)
    store.fail = 1
    await sampler.flush()
    assert store.added == [] and sampler.failed == 1
    counts.update(p2p=8, **{"calls:gw1": 1})  # gw1's stats started again
    await sampler.flush()
    assert store.added == [{"p2p": 3, "l8": 2, "calls:gw1": 1}]


@pytest.mark.parametrize("q", [0.0, 0.5, 1.0])
def test_one_latency_reads_as_itself_at_any_percentile(q: float) -> None:
    h = LatencyHistogram()
    h.add(42.0)
    value = percentile(h.take(), q)
    assert value is not None and 42 <= value <= 42 * 1.2


async def test_a_write_cancelled_at_shutdown_is_made_by_the_final_flush() -> None:
    """Before: the counts of a write cancelled mid-way were lost (7 pushes: `[]`)."""
    counts = {"p2p": 0}
    store = Store()
    gate = asyncio.Event()
    add = store.add

    async def hangs_once(at_ms: int, moved: Mapping[str, int]) -> None:
        if not gate.is_set():
            gate.set()
            await asyncio.sleep(60)
        await add(at_ms, moved)

    store.add = hangs_once  # type: ignore[method-assign]
    sampler = StatsSampler(store, ManualClock(), lambda: counts)  # type: ignore[arg-type]
    counts["p2p"] = 7
    flushing = asyncio.ensure_future(sampler.flush())
    await gate.wait()
    flushing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flushing
    await sampler.final()
    assert store.added == [{"p2p": 7}]
