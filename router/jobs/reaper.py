"""The job reaper: takes over the jobs whose push service died, so none stays "running".

Each running job's lease is renewed by the process running it (see `JobRunner`); a lease
that lapsed means that process is gone (or hung). Any push service may reap any job: the
store re-checks the lapse in the same script that claims or fails the job, so a reaper
never takes a job whose holder renewed it meanwhile, and the claim's new epoch fences off
whatever the old holder still writes. A resumable job is run on by the reaper's process,
the rest are marked failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Protocol

from shared.periodic import Periodic

__all__ = ["Reapable", "reaping"]

log = logging.getLogger(__name__)


class Reapable(Protocol):
    """What takes orphaned jobs over (JobRunner): resumes or fails them, logs it, says
    how many."""

    async def reap(self) -> int: ...


@contextlib.asynccontextmanager
async def reaping(jobs: Reapable, every_s: float) -> AsyncIterator[asyncio.Task[None]]:
    """Take orphaned jobs over now and every `every_s` while the block runs (the task,
    for tests to watch); a failed pass (Redis down) is logged and the next one tries
    again, the jobs wait meanwhile."""
    # Every failed pass is logged: passes come half a lease apart, not a flood.
    async with Periodic("job reaper", jobs.reap, every_s, log=log, log_every_s=0) as reaper:
        assert reaper.task is not None
        yield reaper.task
