"""Push jobs and their status in a real Redis."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from router.bus import HedgedBus
from router.bus.redis_streams import RedisStreamsTransport
from router.fanout.broadcast import run_broadcast
from router.fanout.publisher import BatchPublisher, PushCounters
from router.fanout.runner import JobRun, JobRunner
from router.hedging import Attempt, AttemptContext, RetrySettings
from router.jobs.reaper import reaping
from router.jobs.store import JobStatus, RedisJobStore
from shared.clock import ManualClock, SystemClock
from shared.errors import InvalidInput, RegistryUnavailable
from shared.keys import KeySchema
from shared.models import Message
from shared.proto import gateway_pb2
from tests.integration.stack import AUTH, api

pytestmark = pytest.mark.integration


async def test_a_job_runs_and_reports(redis: aioredis.Redis, prefix: str) -> None:
    store = RedisJobStore(redis, KeySchema(prefix), SystemClock())
    runner = JobRunner(store, renew_s=0.05)

    async def work(run: JobRun) -> None:
        run.counters.recipients = 10
        await asyncio.sleep(0.15)  # long enough for a lease renewal with the counters
        run.counters.batches = run.counters.published = 2

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


async def test_a_failing_job_says_why(
    redis: aioredis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisJobStore(redis, KeySchema(prefix), SystemClock())
    runner = JobRunner(store)

    async def bad(run: JobRun) -> None:
        raise InvalidInput("audience", "unknown key 'nope'")

    async def crash(run: JobRun) -> None:
        raise ZeroDivisionError

    async def forever(run: JobRun) -> None:
        await asyncio.sleep(60)

    with caplog.at_level("WARNING", "router.fanout.runner"):
        await runner.submit("bad", "broadcast", bad)
        await runner.submit("crash", "broadcast", crash)
        await runner.submit("forever", "broadcast", forever)
        await runner.wait("bad")
        await runner.wait("crash")
        await runner.aclose()  # a shutdown while "forever" runs (no grace period)
    # Said in the log too (the Pub/Sub trial: a broadcast whose directory could not be
    # read ended failed in 21 ms, and nothing was logged).
    ended = sorted(r.getMessage() for r in caplog.records if "ended failed" in r.getMessage())
    assert len(ended) == 2 and "unknown key 'nope'" in ended[0], ended
    assert ended[1].endswith("internal error: ZeroDivisionError"), ended
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
    lease = await store.create("orphan", "multicast")
    await store.progress(lease, PushCounters(recipients=5))  # then the process dies
    done = await store.create("done", "multicast")
    await store.progress(done, PushCounters())
    await store.finish(done, PushCounters(published=1), None)
    assert await store.claim_lapsed(3) == ([], 0)  # lease still valid
    clock.advance(11)
    assert await store.claim_lapsed(3) == ([], 1)  # no spec: not resumable, failed
    orphan = await store.get("orphan")
    assert orphan is not None and orphan.status is JobStatus.FAILED
    assert "stopped before it finished" in (orphan.error or "")
    assert orphan.recipients == 5
    finished = await store.get("done")
    assert finished is not None and finished.status is JobStatus.DONE  # not touched
    assert await store.claim_lapsed(3) == ([], 0)


async def orphan(store: RedisJobStore, clock: ManualClock, push_id: str) -> None:
    """A running job whose push service died: its lease lapses 11 s later."""
    lease = await store.create(push_id, "multicast")
    await store.progress(lease, PushCounters(recipients=5))
    clock.advance(11)


async def test_the_reaper_fails_orphans_at_start_and_on_each_pass(
    redis: aioredis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(wall_ms=SystemClock().now_ms())
    store = RedisJobStore(redis, KeySchema(prefix), clock, lease_s=10)
    await orphan(store, clock, "early")
    with caplog.at_level(logging.WARNING, logger="router.fanout.runner"):
        async with reaping(JobRunner(store), every_s=0.05) as task:
            await until_status(store, "early", JobStatus.FAILED)  # the first pass, at once
            await orphan(store, clock, "later")
            await until_status(store, "later", JobStatus.FAILED)  # a later pass
            assert not task.done()
        assert task.cancelled()  # stopped with the block
    assert "marked 1 orphaned push jobs failed" in caplog.text
    later = await store.get("later")
    assert later is not None and "stopped before it finished" in (later.error or "")


async def test_the_reaper_outlives_a_redis_outage(
    redis: aioredis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    class FlakyStore:
        """The real store, but Redis does not answer the first two passes."""

        def __init__(self, inner: RedisJobStore) -> None:
            self.inner = inner
            self.passes = 0

        async def reap(self) -> int:
            self.passes += 1
            if self.passes <= 2:
                raise RegistryUnavailable("redis: connection refused")
            return await JobRunner(self.inner).reap()

    clock = ManualClock(wall_ms=SystemClock().now_ms())
    store = RedisJobStore(redis, KeySchema(prefix), clock, lease_s=10)
    await orphan(store, clock, "orphan")
    flaky = FlakyStore(store)
    with caplog.at_level(logging.WARNING, logger="router.jobs.reaper"):
        async with reaping(flaky, every_s=0.02):
            await until_status(store, "orphan", JobStatus.FAILED)
    assert flaky.passes >= 3
    assert caplog.text.count("job reaper: redis: connection refused") == 2


async def test_the_push_service_reaps_orphans_when_it_starts(
    redis_url: str, redis: aioredis.Redis, prefix: str
) -> None:
    # A job left running by a push service that died a minute ago.
    clock = ManualClock(wall_ms=SystemClock().now_ms() - 60_000)
    await orphan(RedisJobStore(redis, KeySchema(prefix), clock, lease_s=10), clock, "dead")
    async with api(redis_url, prefix) as http:
        for _ in range(100):
            job: dict[str, Any] = (await http.get("/v1/pushes/dead", headers=AUTH)).json()
            if job["status"] != "running":
                break
            await asyncio.sleep(0.02)
    assert job["status"] == "failed" and "stopped before it finished" in job["error"]


class FlakyTransport(RedisStreamsTransport):
    """The real transport, except that each attempt at the batch starting with a listed
    uid fails, that many times, as a dropped connection does; records what went through."""

    def __init__(self, url: str, prefix: str, fail: dict[str, int]) -> None:
        super().__init__(url, prefix)
        self.fail = fail
        self.published: list[tuple[str, tuple[str, ...]]] = []

    async def attempt(self, topic: str, data: bytes, attributes: Mapping[str, str]) -> Attempt[str]:
        real = await super().attempt(topic, data, attributes)
        batch = gateway_pb2.Batch.FromString(data)
        first = batch.uids[0] if batch.uids else ""

        async def flaky(ctx: AttemptContext) -> str:
            if self.fail.get(first, 0) > 0:
                self.fail[first] -= 1
                raise redis.exceptions.ConnectionError("connection reset by peer")
            entry = await real(ctx)
            self.published.append((batch.batch_id, tuple(batch.uids)))
            return entry

        return flaky


MESSAGE = Message(msg_id="m1", push_id="p1", msg_type=0, sender="admin", content_json=b"1", ts_ms=1)


async def test_a_failed_batch_is_retried_then_counted_and_the_broadcast_goes_on(
    redis_url: str, redis: aioredis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisJobStore(redis, KeySchema(prefix), SystemClock())
    runner = JobRunner(store)

    async def pages() -> AsyncIterator[Sequence[str]]:
        yield ["ann", "bob"]  # fails once: the retry publishes it
        yield ["cid"]  # fails every attempt: counted, listed, and the broadcast goes on
        yield ["dan", "eve"]

    # The bus retries a publish for up to its total timeout (60 s by default): 1 s here.
    retry = RetrySettings(initial_backoff_s=0.01, max_backoff_s=0.01, total_timeout_s=1.0)
    transport = FlakyTransport(redis_url, prefix, {"ann": 1, "cid": 1_000_000})
    async with HedgedBus(transport, retry=retry) as bus:

        async def work(run: JobRun) -> None:
            await run_broadcast(pages(), BatchPublisher(bus, MESSAGE, 0, run.counters))

        with caplog.at_level(logging.WARNING):
            await runner.submit("p1", "broadcast", work)
            await runner.wait("p1")
    assert [uids for _, uids in transport.published] == [("ann", "bob"), ("dan", "eve")]
    job = await store.get("p1")
    assert job is not None and job.status is JobStatus.FAILED
    assert (job.recipients, job.batches, job.published, job.failed_batches) == (5, 3, 2, 1)
    assert job.error == (
        "1 of 3 batches failed: not published, or lost by the bus before a gateway read them "
        "(the first: redis did not answer: connection reset by peer)"
    )
    assert [(f.topic, f.uids, f.after) for f in job.failed] == [("broadcast", 1, "bob")]
    assert "a batch of 1 uids to broadcast (after 'bob') failed" in caplog.text


async def test_the_api_reports_the_failed_batches_of_a_job(redis_url: str, prefix: str) -> None:
    async with api(redis_url, prefix, job_publish_backoff_s=0.01) as http:
        bus = http._transport.app.state.parts.bus  # type: ignore[attr-defined]
        await bus.close()  # every publish now raises BusUnavailable
        resp = await http.post(
            "/v1/broadcast", json={"content": 1, "audience": {"online": True}}, headers=AUTH
        )
        assert resp.status_code == 202, resp.text
        push_id = resp.json()["push_id"]
        for _ in range(100):
            job: dict[str, Any] = (await http.get(f"/v1/pushes/{push_id}", headers=AUTH)).json()
            if job["status"] in ("done", "failed"):
                break
            await asyncio.sleep(0.02)
    assert job["status"] == "failed" and "the bus is closed" in job["error"]
    assert (job["batches"], job["published"], job["failed_batches"]) == (1, 0, 1)
    assert job["failed"] == [
        {"topic": "broadcast", "uids": 0, "after": None, "error": "the bus is closed"}
    ]
    assert job["attempts"] == 1


async def until_status(store: RedisJobStore, push_id: str, status: JobStatus) -> None:
    for _ in range(250):
        job = await store.get(push_id)
        if job is not None and job.status is status:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"job {push_id} is not {status}: {await store.get(push_id)}")
