"""Push jobs and their status in a real Redis."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from router.fanout.publisher import PushCounters
from router.fanout.runner import JobRunner
from router.jobs.store import JobStatus, RedisJobStore
from shared.clock import ManualClock, SystemClock
from shared.errors import InvalidInput
from shared.keys import KeySchema

pytestmark = pytest.mark.integration


async def test_a_job_runs_and_reports(redis: aioredis.Redis, prefix: str) -> None:
    store = RedisJobStore(redis, KeySchema(prefix), SystemClock())
    runner = JobRunner(store, renew_s=0.05)

    async def work(counters: PushCounters) -> None:
        counters.recipients = 10
        await asyncio.sleep(0.15)  # long enough for a lease renewal with the counters
        counters.batches = counters.published = 2

    await runner.submit("p1", "multicast", work)
    await asyncio.sleep(0.08)
    running = await store.get("p1")
    assert running is not None and running.status is JobStatus.RUNNING
    assert running.recipients == 10
    await runner.wait("p1")
    job = await store.get("p1")
    assert job is not None
    assert (job.status, job.batches, job.published, job.error) == (JobStatus.DONE, 2, 2, None)
    assert job.finished_at is not None and job.finished_at >= job.created_at
    assert await redis.ttl(KeySchema(prefix).job("p1")) > 0
    assert await store.get("nope") is None


async def test_a_failing_job_says_why(redis: aioredis.Redis, prefix: str) -> None:
    store = RedisJobStore(redis, KeySchema(prefix), SystemClock())
    runner = JobRunner(store)

    async def bad(counters: PushCounters) -> None:
        raise InvalidInput("audience", "unknown key 'nope'")

    async def crash(counters: PushCounters) -> None:
        raise ZeroDivisionError

    async def forever(counters: PushCounters) -> None:
        await asyncio.sleep(60)

    await runner.submit("bad", "broadcast", bad)
    await runner.submit("crash", "broadcast", crash)
    await runner.submit("forever", "broadcast", forever)
    await runner.wait("bad")
    await runner.wait("crash")
    await runner.aclose()  # a shutdown while "forever" runs
    jobs = {p: await store.get(p) for p in ("bad", "crash", "forever")}
    assert {p: (j.status if j else None) for p, j in jobs.items()} == dict.fromkeys(
        jobs, JobStatus.FAILED
    )
    assert "unknown key" in (jobs["bad"].error or "")  # type: ignore[union-attr]
    assert "ZeroDivisionError" in (jobs["crash"].error or "")  # type: ignore[union-attr]
    assert "shut down" in (jobs["forever"].error or "")  # type: ignore[union-attr]


async def test_a_job_orphaned_by_a_dead_push_service_is_failed_by_the_reaper(
    redis: aioredis.Redis, prefix: str
) -> None:
    clock = ManualClock(wall_ms=SystemClock().now_ms())
    store = RedisJobStore(redis, KeySchema(prefix), clock, lease_s=10)
    await store.create("orphan", "multicast")
    await store.progress("orphan", PushCounters(recipients=5))  # then the process dies
    await store.create("done", "multicast")
    await store.progress("done", PushCounters())
    await store.finish("done", PushCounters(published=1), None)
    assert await store.reap() == 0  # lease still valid
    clock.advance(11)
    assert await store.reap() == 1
    orphan = await store.get("orphan")
    assert orphan is not None and orphan.status is JobStatus.FAILED
    assert "stopped before it finished" in (orphan.error or "")
    assert orphan.recipients == 5
    done = await store.get("done")
    assert done is not None and done.status is JobStatus.DONE  # not touched
    assert await store.reap() == 0
