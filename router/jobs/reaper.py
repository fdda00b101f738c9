"""The job reaper: fails the jobs whose push service died, so none stays "running" forever.

Each running job's lease is renewed by the process running it (see `JobRunner`); a lease
that lapsed means that process is gone. Any push service may reap any job: the store's
script fails a job only while it is still running, so reapers never race a late finish.
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
    """A job store that can fail its orphaned jobs."""

    async def reap(self) -> int: ...


async def reap_forever(jobs: Reapable, every_s: float) -> None:
    """Fail orphaned jobs now and every `every_s`; a failed pass is logged and retried."""
    while True:
        try:
            reaped = await jobs.reap()
            if reaped:
                log.warning("marked %d orphaned push jobs failed", reaped)
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
