"""Job leases in a real Redis: the reaper's re-check, fencing, hand-over and resume."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis

from router.fanout.runner import JobRun, JobRunner
from router.jobs.base import Checkpoint, Lease, PushCounters
from router.jobs.store import JobStatus, RedisJobStore
from router.processes.embedded_redis import EmbeddedRedis
from router.redis.client import create_redis
from router.redis.scripts import Script, ScriptRunner
from shared.clock import ManualClock, SystemClock
from shared.errors import RegistryUnavailable
from shared.keys import KeySchema

pytestmark = pytest.mark.integration


class RenewsAfterScan:
    """Redis as the reaper sees it when the holder's renewal lands between the reaper's
    scan for lapsed leases and its look at the job."""

    def __init__(self, redis: aioredis.Redis, renew: Callable[[], Awaitable[Any]]) -> None:
        self._redis = redis
        self._renew = renew

    def __getattr__(self, name: str) -> Any:
        return getattr(self._redis, name)

    async def zrangebyscore(self, *args: Any, **kwargs: Any) -> Any:
        found = await self._redis.zrangebyscore(*args, **kwargs)
        await self._renew()
        return found


async def test_the_reaper_leaves_a_job_renewed_after_its_scan_alone(
    redis: aioredis.Redis, prefix: str
) -> None:
    keys = KeySchema(prefix)
    clock = ManualClock(wall_ms=SystemClock().now_ms())
    holder = RedisJobStore(redis, keys, clock, lease_s=10)
    lease = await holder.create("live", "multicast")
    clock.advance(11)  # the holder was slow to renew: the reaper's scan finds it lapsed...
    renew = functools.partial(holder.progress, lease, PushCounters(recipients=7))
    # ... and its renewal lands right after that scan.
    reaper = RedisJobStore(RenewsAfterScan(redis, renew), keys, clock, lease_s=10)  # type: ignore[arg-type]
    assert await reaper.claim_lapsed(3) == ([], 0)
    job = await holder.get("live")
    assert job is not None and (job.status, job.recipients) == (JobStatus.RUNNING, 7)
    assert await holder.finish(lease, PushCounters(recipients=7, published=1), None)
    job = await holder.get("live")
    assert job is not None and job.status is JobStatus.DONE


async def test_a_stale_holders_writes_are_refused(redis: aioredis.Redis, prefix: str) -> None:
    clock = ManualClock(wall_ms=SystemClock().now_ms())
    store = RedisJobStore(redis, KeySchema(prefix), clock, lease_s=10)
    stale = await store.create("p1", "broadcast", spec=b"{}")
    assert await store.progress(
        stale, PushCounters(recipients=1), Checkpoint("a", 1, PushCounters())
    )
    clock.advance(11)  # the holder hangs; its lease lapses; another process claims the job
    [claim], failed = await store.claim_lapsed(3)
    assert (failed, claim.lease, claim.attempts) == (0, Lease("p1", 2), 2)
    assert claim.checkpoint is not None and claim.checkpoint.after == "a"
    # The old holder wakes up: its renewal, checkpoint, hand-over and end are all refused.
    assert not await store.progress(stale, PushCounters(recipients=99))
    assert not await store.progress(stale, PushCounters(), Checkpoint("zzz", 9, PushCounters()))
    assert not await store.release(stale, Checkpoint("zzz", 9, PushCounters()))
    assert not await store.finish(stale, PushCounters(published=99), None)
    job = await store.get("p1")
    assert job is not None and (job.status, job.recipients) == (JobStatus.RUNNING, 1)
    assert await store.finish(claim.lease, PushCounters(recipients=3, published=3), None)
    # ... and stays refused after the new holder's end.
    assert not await store.finish(stale, PushCounters(), "the push service shut down")
    job = await store.get("p1")
    assert job is not None and (job.status, job.published, job.error) == (JobStatus.DONE, 3, None)


async def test_a_runner_whose_job_was_taken_over_stops_and_writes_nothing(
    redis: aioredis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(wall_ms=SystemClock().now_ms())
    store = RedisJobStore(redis, KeySchema(prefix), clock, lease_s=10)
    # Renews rarely, so no renewal of its own lands between the take-over's scan and claim.
    paused = JobRunner(store, renew_s=0.5)
    published: list[str] = []
    release = asyncio.Event()

    async def slow(run: JobRun) -> None:
        await release.wait()
        published.append("late")  # never reached: the run is cancelled when fenced

    await paused.submit("p1", "broadcast", slow, spec=b"{}")
    clock.advance(11)  # this process stalls past its lease; another one claims the job
    other = JobRunner(store)
    resumed = asyncio.Event()

    async def rest(run: JobRun) -> None:
        await resumed.wait()
        run.counters.published = 5

    other.resume_with(lambda claim: rest)
    with caplog.at_level(logging.WARNING, logger="router.fanout.runner"):
        assert await other.reap() == 1
        # The stalled run notices at its next renewal, while the new holder still runs.
        await asyncio.wait_for(paused.wait("p1"), 2)
        running = await store.get("p1")
        assert running is not None and running.status is JobStatus.RUNNING
        resumed.set()
        await other.wait("p1")
    assert published == []
    job = await store.get("p1")
    assert job is not None and (job.status, job.published, job.attempts) == (JobStatus.DONE, 5, 2)
    assert "another process took it over (this run held epoch 1)" in caplog.text


async def test_a_runner_whose_job_record_is_gone_says_so_not_a_take_over(
    redis: aioredis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis restarted empty under a running job: the operator's trial read "another
    process took it over", with no other process anywhere."""
    store = RedisJobStore(redis, KeySchema(prefix), SystemClock(), lease_s=10)
    runner = JobRunner(store, renew_s=0.05)
    release = asyncio.Event()

    async def work(run: JobRun) -> None:
        run.counters.published, run.counters.recipients = 3, 3000
        await release.wait()

    await runner.submit("p1", "broadcast", work, spec=b"{}")
    await redis.delete(KeySchema(prefix).job("p1"))
    with caplog.at_level(logging.WARNING, logger="router.fanout.runner"):
        await asyncio.wait_for(runner.wait("p1"), 2)
    assert "its record is gone (Redis lost its data" in caplog.text
    assert "publishing 3 batches to 3000 recipients" in caplog.text
    assert "took it over" not in caplog.text
    assert await store.get("p1") is None  # nothing written back


async def test_a_stopping_runner_lets_its_jobs_finish_within_the_grace_period(
    redis: aioredis.Redis, prefix: str
) -> None:
    store = RedisJobStore(redis, KeySchema(prefix), SystemClock())
    runner = JobRunner(store, grace_s=5)

    async def short(run: JobRun) -> None:
        await asyncio.sleep(0.3)
        await run.checkpoint("u1", 1)
        run.counters.published = 1

    await runner.submit("p1", "broadcast", short, spec=b"{}")
    await runner.aclose()
    job = await store.get("p1")
    assert job is not None and (job.status, job.published) == (JobStatus.DONE, 1)


async def test_a_stopped_job_is_handed_over_at_its_checkpoint_and_resumed_elsewhere(
    redis: aioredis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisJobStore(redis, KeySchema(prefix), SystemClock())
    first = JobRunner(store, grace_s=0.1)
    done: list[int] = []

    async def pages(run: JobRun) -> None:
        start = run.start.pages if run.start else 0
        for n in range(start + 1, 11):
            await asyncio.sleep(0.05)
            run.counters.batches += 1
            run.counters.published += 1
            done.append(n)
            await run.checkpoint(f"u{n}", n)

    await first.submit("p1", "broadcast", pages, spec=b"{}")
    with caplog.at_level(logging.WARNING, logger="router.fanout.runner"):
        await first.aclose()  # after 0.1 s: stops at the next checkpoint
        handed = await store.get("p1")
        assert handed is not None and handed.status is JobStatus.QUEUED
        by_first = len(done)
        assert 1 <= by_first < 10
        second = JobRunner(store)
        second.resume_with(lambda claim: pages)
        assert await second.reap() == 1  # at once: a hand-over waits for no lease
        await second.wait("p1")
    assert done == list(range(1, 11))  # every page once, none twice
    job = await store.get("p1")
    assert job is not None and (job.status, job.published, job.batches) == (JobStatus.DONE, 10, 10)
    assert job.attempts == 1  # a hand-over is not a failed attempt
    assert f"job p1 handed over after page {by_first}" in caplog.text
    assert f"resuming job p1 (broadcast) after page {by_first}, attempt 1" in caplog.text


async def test_a_job_whose_processes_keep_dying_fails_after_its_attempts(
    redis: aioredis.Redis, prefix: str
) -> None:
    clock = ManualClock(wall_ms=SystemClock().now_ms())
    store = RedisJobStore(redis, KeySchema(prefix), clock, lease_s=10)
    await store.create("p1", "broadcast", spec=b"{}")
    for attempt in (2, 3):
        clock.advance(11)
        [claim], _ = await store.claim_lapsed(3)
        assert claim.attempts == attempt
    clock.advance(11)
    assert await store.claim_lapsed(3) == ([], 1)
    job = await store.get("p1")
    assert job is not None and job.status is JobStatus.FAILED
    assert job.error == (
        "the push service running this job stopped before it finished, 3 times "
        "(IMROUTE_JOB_MAX_ATTEMPTS)"
    )


async def test_a_job_that_cannot_be_claimed_is_passed_over(
    redis: aioredis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A record Redis refuses to claim (not a hash) would stop every pass at it: it is
    passed over, said, and the lapsed jobs on either side of it are claimed."""
    keys = KeySchema(prefix)
    clock = ManualClock(wall_ms=SystemClock().now_ms())
    store = RedisJobStore(redis, keys, clock, lease_s=10)
    for push_id in ("first", "broken", "last"):
        await store.create(push_id, "broadcast", spec=b"{}")
        clock.advance(1)
    await redis.delete(keys.job("broken"))
    await redis.set(keys.job("broken"), "not a hash")  # its claim fails: WRONGTYPE
    clock.advance(11)
    with caplog.at_level(logging.WARNING, "router.jobs.store"):
        claims, failed = await store.claim_lapsed(3)
    assert [c.lease for c in claims] == [Lease("first", 2), Lease("last", 2)] and failed == 0
    [line] = [r.getMessage() for r in caplog.records if "cannot be claimed" in r.getMessage()]
    assert line.startswith("lapsed job broken cannot be claimed: ") and "WRONGTYPE" in line


async def test_claims_made_before_redis_stops_answering_are_kept(
    prefix: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims already written in Redis are returned when Redis stops answering during the
    pass (here: killed after the first claim): dropped, their new leases would lapse and
    each retake would cost an attempt."""
    keys = KeySchema(prefix)
    clock = ManualClock(wall_ms=SystemClock().now_ms())
    with EmbeddedRedis() as embedded:
        assert embedded.url
        redis = aioredis.Redis.from_url(embedded.url, decode_responses=True)
        store = RedisJobStore(redis, keys, clock, lease_s=10)
        for push_id in ("first", "second"):
            await store.create(push_id, "broadcast", spec=b"{}")
            clock.advance(1)
        clock.advance(11)

        class KilledAfterOne(ScriptRunner):
            async def run(self, script: Script, keys: Sequence[str], *args: Any) -> Any:
                got = await super().run(script, keys, *args)
                embedded.stop()  # Redis is gone before the next claim
                return got

        monkeypatch.setattr("router.jobs.store.ScriptRunner", KilledAfterOne)
        with caplog.at_level(logging.WARNING, "router.jobs.store"):
            [claim], failed = await store.claim_lapsed(3)
        assert (claim.lease, claim.attempts, failed) == (Lease("first", 2), 2, 0)
        assert "claimed 1 of 2 lapsed jobs, then: redis did not answer" in caplog.text
        await redis.aclose()


async def test_a_creation_redis_runs_late_creates_no_job(
    prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator's trial: Redis paused (SIGSTOP) under POST /v1/broadcast, answered
    503 "nothing was sent"; resumed, Redis ran the creation it had buffered, and the
    broadcast went out (once ten minutes late). Here Redis pauses just after the creation
    read its clock, and resumes after the caller gave up: the creation, run then, is past
    its deadline and writes nothing."""
    keys = KeySchema(prefix)
    with EmbeddedRedis() as embedded:
        pid = embedded.pid
        assert embedded.url and pid is not None

        class PausedAfterTheClock(ScriptRunner):
            async def run(self, script: Script, keys: Sequence[str], *args: Any) -> Any:
                got = await super().run(script, keys, *args)
                if len(keys) == 1:  # the clock's read: the creation comes next
                    os.kill(pid, signal.SIGSTOP)
                    asyncio.get_running_loop().call_later(1.5, os.kill, pid, signal.SIGCONT)
                return got

        monkeypatch.setattr("router.jobs.store.ScriptRunner", PausedAfterTheClock)
        redis = create_redis(embedded.url, timeout_s=0.5)
        store = RedisJobStore(redis, keys, SystemClock(), redis_timeout_s=0.5)
        with pytest.raises(RegistryUnavailable) as refused:
            await store.create("late", "broadcast", spec=b"{}")
        assert refused.value.maybe_applied  # sent, its reply lost: it may run...
        await asyncio.sleep(2.0)  # ... and Redis, resumed, ran it
        check = aioredis.Redis.from_url(embedded.url, decode_responses=True)
        assert await check.exists(keys.job("late")) == 0  # ... past its deadline: nothing
        assert await check.zcard(keys.jobs_running()) == 0
        # On time, the same creation creates the job.
        monkeypatch.setattr("router.jobs.store.ScriptRunner", ScriptRunner)
        fresh = RedisJobStore(redis, keys, SystemClock(), redis_timeout_s=0.5)
        assert await fresh.create("on-time", "broadcast") == Lease("on-time", 1)
        assert await check.exists(keys.job("on-time")) == 1
        await check.aclose()
        await redis.aclose()
