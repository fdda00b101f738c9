"""Runs push jobs in the background, keeping their status, checkpoint and lease in the store.

A job is resumable when it was submitted with a spec and its work checkpoints as it goes
(`JobRun.checkpoint`): at a shutdown, or when its process died and its lease lapsed,
another push service claims it (`reap`) and runs it on from its last checkpoint. The other
jobs end failed when their process stops.

Shutdown (`aclose`): running jobs get `grace_s` to finish; then resumable ones stop at
their next checkpoint and are released for another process, the rest are cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field

from router.jobs.base import Checkpoint, Claim, JobStore, Lease, PushCounters
from shared.errors import ImrouteError
from shared.logs import bind, unbind
from shared.tracing import AttributeValue, Status, StatusCode, Tracer

__all__ = ["Handover", "JobRun", "JobRunner", "LeaseLost", "Resume", "Work"]

log = logging.getLogger(__name__)

# After the grace period, how long a resumable job may take to reach its next
# checkpoint (the page in flight and its publish retries) before it is cancelled.
STOP_S = 5.0
SHUT_DOWN = "the push service shut down before the job finished"


class Handover(Exception):  # control flow, not an error
    """Raised at a checkpoint while the runner stops: the job ends here, to be resumed.
    Never escapes the runner."""


class LeaseLost(Exception):  # control flow, not an error
    """The store refused a write of this run: another process holds the job now.
    Never escapes the runner."""


class JobRun:
    """One run of a job in this process: its counters, where it starts, its checkpoints."""

    def __init__(
        self,
        lease: Lease,
        start: Checkpoint | None,
        store: JobStore,
        stopping: asyncio.Event,
    ) -> None:
        self.lease = lease
        self.start = start  # None: from the beginning
        self.counters = start.counters.copy() if start else PushCounters()
        self.last = start  # the latest consistent point, for a hand-over
        self.lost = False
        self.gone: bool | None = None  # lost with its record (None: not looked at)
        self._store = store
        self._stopping = stopping

    @property
    def push_id(self) -> str:
        return self.lease.push_id

    @property
    def stopping(self) -> bool:
        """The runner is stopping: a job that checkpoints by time checkpoints now."""
        return self._stopping.is_set()

    async def checkpoint(self, after: str | None, pages: int) -> None:
        """Record that everything up to `after` (`pages` pages) is published or counted.

        Raises LeaseLost if another process took the job over, Handover if the runner is
        stopping (the job is released from here). A Redis error is logged and the job
        goes on: its lease lapses if Redis stays away, and a take-over re-publishes from
        the last checkpoint that was written (harmless: see `stable_batch_id`).
        """
        self.last = Checkpoint(after, pages, self.counters.copy())
        try:
            written = await self._store.progress(self.lease, self.counters, self.last)
        except ImrouteError as exc:
            log.warning("job %s: could not record its checkpoint: %s", self.push_id, exc)
            written = True
        if not written:
            self.lost = True
            raise LeaseLost(self.push_id)
        if self._stopping.is_set():
            raise Handover(self.push_id)


Work = Callable[[JobRun], Awaitable[None]]
# Builds a claimed job's work from its spec; InvalidInput if the spec cannot be run here.
Resume = Callable[[Claim], Work]


@dataclass(slots=True, eq=False)
class JobRunner:
    """`tracer`: each run a `push.job` span (shared.tracing), under the request's span
    that submitted it (a resumed job's starts a trace of its own)."""

    store: JobStore
    renew_s: float = 3.0
    _: KW_ONLY
    max_attempts: int = 3
    grace_s: float = 0.0
    tracer: Tracer | None = None
    _resume: Resume | None = field(default=None, init=False, repr=False)
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict, init=False, repr=False)
    _runs: dict[str, tuple[JobRun, bool]] = field(default_factory=dict, init=False, repr=False)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)
    _closing: bool = field(default=False, init=False, repr=False)

    def resume_with(self, resume: Resume) -> None:
        """How claimed jobs are run; without it, `reap` only fails orphans that cannot be."""
        self._resume = resume

    async def submit(self, push_id: str, mode: str, work: Work, spec: bytes | None = None) -> None:
        """Record the job as queued (resumable if it has a `spec`), then run `work`."""
        lease = await self.store.create(push_id, mode, spec)
        run = JobRun(lease, None, self.store, self._stopping)
        self._start(run, self._traced(work, mode), spec is not None)

    async def reap(self) -> int:
        """Take over the jobs whose process died (or handed them over): resume those that
        can be, fail the rest. How many were resumed or failed."""
        if self._closing:
            return 0
        claims, failed = await self.store.claim_lapsed(self.max_attempts)
        if failed:
            log.warning("marked %d orphaned push jobs failed", failed)
        for claim in claims:
            run = JobRun(claim.lease, claim.checkpoint, self.store, self._stopping)
            at = claim.checkpoint.pages if claim.checkpoint else 0
            try:
                if self._resume is None:
                    raise ImrouteError("this process cannot resume jobs")
                work = self._resume(claim)
            except ImrouteError as exc:
                log.warning("job %s (%s) cannot be resumed: %s", run.push_id, claim.mode, exc)
                try:
                    await self.store.finish(claim.lease, run.counters, f"cannot be resumed: {exc}")
                except ImrouteError as again:  # its lease lapses: a later pass takes it again
                    log.warning("could not mark job %s failed: %s", run.push_id, again)
                continue
            log.warning(
                "resuming job %s (%s) after page %d, attempt %d",
                run.push_id,
                claim.mode,
                at,
                claim.attempts,
            )
            self._start(run, self._traced(work, claim.mode, resumed=True), True)
        return failed + len(claims)

    def _traced(self, work: Work, mode: str, resumed: bool = False) -> Work:
        """`work`, its run a span, when tracing is on."""
        tracer = self.tracer
        if tracer is None:
            return work

        async def traced(run: JobRun) -> None:
            attributes: dict[str, AttributeValue] = {
                "imroute.push_id": run.push_id,
                "imroute.mode": mode,
                "imroute.resumed": resumed,
            }
            with tracer.start_as_current_span(
                "push.job", attributes=attributes, set_status_on_exception=False
            ) as span:
                try:
                    await work(run)
                except (Handover, LeaseLost) as exc:  # control flow: the run ends here
                    span.set_attribute("imroute.ended", type(exc).__name__)
                    raise
                except Exception as exc:
                    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                    raise
                finally:
                    c = run.counters
                    span.set_attributes(
                        {
                            "imroute.recipients": c.recipients,
                            "imroute.online": c.online,
                            "imroute.offline": c.offline,
                            "imroute.batches": c.batches,
                            "imroute.published": c.published,
                            "imroute.failed_batches": c.failed_batches,
                        }
                    )

        return traced

    def _start(self, run: JobRun, work: Work, resumable: bool) -> None:
        push_id = run.push_id
        bound = bind(push_id=push_id)  # the task's every line names its push (shared.logs)
        try:
            task = asyncio.create_task(self._run(run, work, resumable), name=f"job:{push_id}")
        finally:
            unbind(bound)
        self._tasks[push_id] = task
        self._runs[push_id] = (run, resumable)

        def forget(done: asyncio.Task[None]) -> None:
            # A job this process lost and took back has a newer task under its id.
            if self._tasks.get(push_id) is done:
                del self._tasks[push_id]
                del self._runs[push_id]

        task.add_done_callback(forget)

    async def _run(self, run: JobRun, work: Work, resumable: bool) -> None:
        error: str | None = None
        handover = False
        stop = asyncio.Event()
        job = asyncio.current_task()
        renew = asyncio.create_task(self._renew(run, stop, job))
        try:
            await work(run)
        except Handover:
            handover = True
        except LeaseLost:
            pass
        except asyncio.CancelledError:
            # Cancelled at shutdown (or because the lease was lost): a resumable job is
            # handed over from its last checkpoint, where the next process starts.
            handover = resumable
            error = SHUT_DOWN
            raise
        except ImrouteError as exc:
            error = str(exc)
        except Exception as exc:
            log.exception("job %s failed", run.push_id)
            error = f"internal error: {type(exc).__name__}"
        finally:
            # Stopped, not cancelled: a renewal in flight completes before the job's end
            # is written (cancelling a Redis call midway is not reliably clean).
            stop.set()
            await renew
            if run.lost:
                if run.gone is None:  # fenced at a checkpoint: not cancelled, may look
                    run.gone = await self._gone(run.push_id)
                self._said_lost(run)
            else:
                await self._end(run, error, handover)

    async def _gone(self, push_id: str) -> bool:
        """Whether a job's record is gone (Redis lost its data); False when unknown."""
        try:
            return await self.store.get(push_id) is None
        except ImrouteError:
            return False

    @staticmethod
    def _said_lost(run: JobRun) -> None:
        """Why a run lost its job: taken over, or its record gone with Redis's data."""
        c = run.counters
        if run.gone:
            log.error(
                "job %s: its record is gone (Redis lost its data: a restart without "
                "persistence, a failover that lost writes); this run stopped after "
                "publishing %d batches to %d recipients, and the rest is not sent",
                run.push_id,
                c.published,
                c.recipients,
            )
            return
        log.warning(
            "job %s: another process took it over (this run held epoch %d); "
            "this run stopped and wrote nothing more",
            run.push_id,
            run.lease.epoch,
        )

    async def _end(self, run: JobRun, error: str | None, handover: bool) -> None:
        c = run.counters
        if error is None and c.failed_batches:
            # Not published after retries, or trimmed by the bus before a lagging gateway
            # read them (router.bus.losses): either way some recipients did not get it.
            error = (
                f"{c.failed_batches} of {c.batches} batches failed: not published, or "
                "lost by the bus before a gateway read them"
            )
            if c.failed:
                error += f" (the first: {c.failed[0].error})"
        try:
            if handover:
                written = await self.store.release(run.lease, run.last)
                if written:
                    at = run.last.pages if run.last else 0
                    log.warning("job %s handed over after page %d", run.push_id, at)
            else:
                written = await self.store.finish(run.lease, c, error)
        except ImrouteError as exc:
            # The lease lapses and the reaper resumes or fails the job.
            log.warning("could not record the end of job %s: %s", run.push_id, exc)
            return
        if not written:
            log.warning(
                "job %s: its record refused this run's %s (epoch %d): another process "
                "took the job over, or it had ended",
                run.push_id,
                "hand-over" if handover else "end",
                run.lease.epoch,
            )
        elif error is not None and not handover:
            # Its record says so too (GET /v1/pushes/{id}); the log is where an operator
            # looks first.
            log.warning(
                "job %s ended failed after publishing %d of %d batches to %d recipients: %s",
                run.push_id,
                c.published,
                c.batches,
                c.recipients,
                error,
            )

    async def _renew(
        self, run: JobRun, stop: asyncio.Event, job: asyncio.Task[None] | None
    ) -> None:
        while not stop.is_set():
            try:
                if not await self.store.progress(run.lease, run.counters):
                    # Fenced: the job is someone else's now, or its record is gone;
                    # nothing this run does counts. Looked at here: the job's own task
                    # is cancelled from here on.
                    run.lost = True
                    run.gone = await self._gone(run.push_id)
                    if job is not None:
                        job.cancel()
                    return
            except ImrouteError as exc:
                log.warning("job %s: could not renew its lease: %s", run.push_id, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.renew_s)

    async def wait(self, push_id: str) -> None:
        """Wait for a job started here to end (tests, graceful shutdown)."""
        task = self._tasks.get(push_id)
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)

    async def aclose(self) -> None:
        """Let running jobs finish within the grace period; then hand resumable ones
        over at their next checkpoint and cancel the rest (each records why)."""
        self._closing = True
        tasks = list(self._tasks.values())
        if not tasks:
            return
        log.info("waiting up to %.1f s for %d running push jobs", self.grace_s, len(tasks))
        _, pending = await asyncio.wait(tasks, timeout=self.grace_s)
        if pending:
            self._stopping.set()
            for run, resumable in list(self._runs.values()):
                if not resumable:
                    self._tasks[run.push_id].cancel()
            _, pending = await asyncio.wait(pending, timeout=STOP_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
