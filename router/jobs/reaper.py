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

from shared.errors import ImrouteError

__all__ = ["Reapable", "reap_forever", "reaping"]

log = logging.getLogger(__name__)


class Reapable(Protocol):
    """What takes orphaned jobs over (JobRunner): resumes or fails them, logs it, says
    how many."""

    async def reap(self) -> int: ...


async def reap_forever(jobs: Reapable, every_s: float) -> None:
    """Take orphaned jobs over now and every `every_s`; a failed pass is logged and retried."""
    while True:
        try:
            await jobs.reap()
        except ImrouteError as exc:
            # Redis is down: the next pass tries again; the jobs wait meanwhile.
            log.warning("job reaper: %s", exc)
        await asyncio.sleep(every_s)


@contextlib.asynccontextmanager
async def reaping(jobs: Reapable, every_s: float) -> AsyncIterator[asyncio.Task[None]]:
    """Run `reap_forever` in a task for the block's lifetime; cancelled on exit."""
    task = asyncio.create_task(reap_forever(jobs, every_s), name="job-reaper")
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
