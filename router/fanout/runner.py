"""Runs push jobs in the background, keeping their status and lease in the job store."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from router.jobs.base import JobStore, PushCounters
from shared.errors import ImrouteError

__all__ = ["JobRunner"]

log = logging.getLogger(__name__)

Work = Callable[[PushCounters], Awaitable[None]]


class JobRunner:
    def __init__(self, store: JobStore, renew_s: float = 3.0) -> None:
        self._store = store
        self._renew_s = renew_s
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def submit(self, push_id: str, mode: str, work: Work) -> None:
        """Record the job as queued, then run `work` in the background."""
        await self._store.create(push_id, mode)
        task = asyncio.create_task(self._run(push_id, work), name=f"job:{push_id}")
        self._tasks[push_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(push_id, None))

    async def _run(self, push_id: str, work: Work) -> None:
        counters = PushCounters()
        error: str | None = None
        stop = asyncio.Event()
        renew = asyncio.create_task(self._renew(push_id, counters, stop))
        try:
            await work(counters)
        except asyncio.CancelledError:
            error = "the push service shut down before the job finished"
            raise
        except ImrouteError as exc:
            error = str(exc)
        except Exception as exc:
            log.exception("job %s failed", push_id)
            error = f"internal error: {type(exc).__name__}"
        finally:
            # Stopped, not cancelled: a renewal in flight completes before the job's end
            # is written (cancelling a Redis call midway is not reliably clean).
            stop.set()
            await renew
            try:
                await self._store.finish(push_id, counters, error)
            except ImrouteError as exc:
                # The lease lapses and the reaper marks the job failed.
                log.warning("could not record the end of job %s: %s", push_id, exc)

    async def _renew(self, push_id: str, counters: PushCounters, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._store.progress(push_id, counters)
            except ImrouteError as exc:
                log.warning("job %s: could not renew its lease: %s", push_id, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._renew_s)

    async def wait(self, push_id: str) -> None:
        """Wait for a job started here to end (tests, graceful shutdown)."""
        task = self._tasks.get(push_id)
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)

    async def aclose(self) -> None:
        """Cancel the jobs still running; each records why it failed."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
