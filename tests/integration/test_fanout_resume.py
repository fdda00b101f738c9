"""A multicast taken over by another push service runs on from its checkpoint.

`FanOut.resume` builds the work of a claimed job from the spec its record keeps; here it
runs against a real SQLite directory (a `tags_any` audience) or the kept `to` list, with
every recipient online in memory, and a recorder for the bus. The process-level take-over
(SIGTERM, SIGKILL) is tests/integration/test_job_restarts.py's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from push_service.services.fanout import FanOut
from router.directory.base import UserRecord
from router.directory.migrate import upgrade
from router.directory.sql import SqlUserDirectory
from router.fanout.runner import JobRun, JobRunner
from router.jobs.base import Checkpoint, Claim, Lease, PushCounters
from router.jobs.specs import MulticastSpec
from router.testing.routes import MemoryRouteRegistry
from router.testing.stores import MemoryJobStore
from shared.clock import SystemClock
from shared.models import Registration
from tests.integration.recording_bus import RecordingBus, message

pytestmark = pytest.mark.integration

USERS = [f"u{i:05d}" for i in range(3000)]


@pytest.fixture
async def directory(tmp_path: Path) -> AsyncIterator[SqlUserDirectory]:
    """USERS, every one tagged "t", and one more without the tag."""
    url = f"sqlite+aiosqlite:///{tmp_path}/users.db"
    await upgrade(url)
    async with SqlUserDirectory.from_url(url, SystemClock()) as d:
        await d.upsert([UserRecord(uid, ("t",)) for uid in USERS] + [UserRecord("u00500x")])
        yield d


@pytest.mark.parametrize("source", ["to", "tags_any"])
async def test_a_multicast_resumed_from_its_checkpoint_sends_what_was_left(
    directory: SqlUserDirectory, source: str
) -> None:
    clock = SystemClock()
    routes = MemoryRouteRegistry(clock)
    await routes.refresh(Registration(uid, f"c-{uid}") for uid in [*USERS, "u00500x"])
    bus = RecordingBus()
    store = MemoryJobStore(clock)
    fanout = FanOut(
        bus, directory, routes, JobRunner(store), store, clock, batch_size=400, flush_timeout_s=1.0
    )
    spec = MulticastSpec(
        message(),
        0,
        False,
        False,
        tuple(USERS) if source == "to" else None,
        ("t",) if source == "tags_any" else None,
        1000,
        400,
    )
    # The first run got through one chunk of 1000 before its process died.
    before = PushCounters(recipients=1000, online=1000, batches=3, published=3)
    at = Checkpoint("u00999", 1, before)
    claim = Claim(Lease("p1", 2), "multicast", spec.to_json().decode(), at, 2)
    work = fanout.resume(claim)
    run = JobRun(claim.lease, claim.checkpoint, store, asyncio.Event())
    await work(run)
    sent = [uid for _, batch, _ in bus.published for uid in batch.uids]
    assert sorted(sent) == USERS[1000:]  # each once, none of the first chunk's
    c = run.counters
    assert (c.recipients, c.online, c.offline) == (3000, 3000, 0)
    assert (c.batches, c.published) == (3 + 5, 3 + 5)  # 2000 more in one group, by 400
