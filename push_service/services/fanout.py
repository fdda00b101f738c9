"""Broadcast and multicast: accepted at once, run as background jobs with a status."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Protocol

from push_service.content import new_message
from push_service.errors import NotFound
from push_service.schemas import BroadcastIn, MulticastIn
from push_service.services.pushes import Receipts
from router.directory.base import UserDirectory
from router.fanout.broadcast import pages_after, run_broadcast
from router.fanout.multicast import chunked, run_multicast
from router.fanout.publisher import BatchPublisher, Publisher
from router.fanout.runner import JobRun, JobRunner, Work
from router.jobs.base import Claim, Job, PushCounters
from router.jobs.specs import BroadcastSpec, MulticastSpec
from router.receipts.base import message_meta
from router.receipts.fanout import FanoutReceipt
from router.recovery.base import RecoveryLog
from router.routes.base import LOOKUP_CHUNK, GroupLookup
from router.routes.traced import TracedGroupLookup
from shared.clock import Clock
from shared.errors import InvalidInput
from shared.models import Message
from shared.tracing import Tracer, current_span

__all__ = ["FanOut", "JobReader"]


class JobReader(Protocol):
    """Where job records are read from."""

    async def get(self, push_id: str) -> Job | None: ...


@dataclass(slots=True, eq=False)
class FanOut:
    """Starts broadcast and multicast jobs on the bus, and reads their status."""

    bus: Publisher
    directory: UserDirectory
    groups: GroupLookup
    runner: JobRunner
    jobs: JobReader
    clock: Clock
    _: KW_ONLY
    batch_size: int
    flush_timeout_s: float
    recovery: RecoveryLog | None = None
    receipts: Receipts | None = None
    # Tracing on: each chunk's look-up and each batch's publish a span.
    tracer: Tracer | None = None
    # Jobs started, by mode (router.stats samples them).
    started: dict[str, int] = field(
        default_factory=lambda: {"broadcast": 0, "multicast": 0}, init=False
    )
    _lookup: GroupLookup = field(init=False, repr=False)  # `groups`, traced when on

    def __post_init__(self) -> None:
        tracer = self.tracer
        self._lookup = self.groups if tracer is None else TracedGroupLookup(self.groups, tracer)

    async def broadcast(self, body: BroadcastIn, *, seed: str | None) -> str:
        """Start a broadcast job; its push id. It is resumable (router.jobs.specs).
        `seed`: the request's id seed (`push_service.idempotency.http.Handler`)."""
        message, expires_ms = self._message(body, seed)
        audience = body.audience
        spec = BroadcastSpec(
            message,
            expires_ms,
            body.store,
            tuple(audience.tags_any) if audience and audience.tags_any else None,
            bool(audience and audience.online),
            self.batch_size,
        )
        return await self._submit("broadcast", spec, self._broadcast(spec))

    def resume(self, claim: Claim) -> Work:
        """The work of a job another process started (JobRunner.reap)."""
        if claim.mode == "broadcast":
            return self._broadcast(BroadcastSpec.from_json(claim.spec))
        if claim.mode == "multicast":
            return self._multicast(MulticastSpec.from_json(claim.spec))
        raise InvalidInput("mode", f"{claim.mode} jobs are not resumable")

    def _broadcast(self, spec: BroadcastSpec) -> Work:
        async def work(run: JobRun) -> None:
            publisher = self._publisher(spec.message, spec.expires_ms, run.counters, spec.store)
            receipt = self._receipt(spec.message, "broadcast", None, spec.store)
            if receipt is not None:
                await receipt.start()
            start = run.start
            after = start.after if start else None
            pages = (
                None
                if spec.online_only
                else pages_after(self.directory, after, spec.batch_size, spec.tags_any)
            )
            await run_broadcast(
                pages,
                publisher,
                checkpoint=run.checkpoint,
                done_pages=start.pages if start else 0,
                after=after,
            )
            if receipt is not None and pages is not None:
                await receipt.counted(run.counters.recipients)

        return work

    async def multicast(self, body: MulticastIn, *, seed: str | None) -> str:
        """Start a multicast job; its push id. It is resumable (router.jobs.specs)."""
        message, expires_ms = self._message(body, seed)
        spec = MulticastSpec(
            message,
            expires_ms,
            body.store,
            body.priority == "high",
            body.to,
            tuple(body.audience.tags_any or ()) if body.audience else None,
            LOOKUP_CHUNK,
            self.batch_size,
        )
        return await self._submit("multicast", spec, self._multicast(spec))

    async def _submit(self, mode: str, spec: BroadcastSpec | MulticastSpec, work: Work) -> str:
        """Start the job, resumable from its spec; its push id."""
        push_id = spec.message.push_id
        self._named(spec.message, mode)
        await self.runner.submit(push_id, mode, work, spec.to_json())
        self.started[mode] += 1
        return push_id

    def _multicast(self, spec: MulticastSpec) -> Work:
        async def work(run: JobRun) -> None:
            publisher = self._publisher(spec.message, spec.expires_ms, run.counters, spec.store)
            to = spec.to
            receipt = self._receipt(
                spec.message, "multicast", None if to is None else len(to), spec.store
            )
            start = run.start
            done = start.pages if start else 0
            if receipt is not None:
                if start is not None:  # its counts go on from the checkpoint's
                    receipt.recipients = start.counters.recipients
                    receipt.online = start.counters.online
                await receipt.start()
            chunks: AsyncIterator[Sequence[str]] = (
                chunked(to[done * spec.chunk :] if done else to, spec.chunk)
                if to is not None
                else pages_after(
                    self.directory, start.after if start else None, spec.chunk, spec.tags_any
                )
            )
            await run_multicast(
                chunks,
                self._lookup,
                publisher,
                self.clock,
                batch_size=spec.batch_size,
                flush_timeout_s=self.flush_timeout_s,
                high_priority=spec.high_priority,
                on_resolved=None if receipt is None else receipt.resolved,
                run=run,
                done_chunks=done,
            )

        return work

    def _named(self, message: Message, mode: str) -> None:
        """The push's ids on its request's span (tracing on)."""
        if self.tracer is not None:
            current_span().set_attributes(
                {
                    "imroute.push_id": message.push_id,
                    "imroute.msg_id": message.msg_id,
                    "imroute.mode": mode,
                }
            )

    async def status(self, push_id: str) -> Job:
        """The job's record; NotFound if there is none (or it expired)."""
        job = await self.jobs.get(push_id)
        if job is None:
            raise NotFound(f"no push job {push_id!r}")
        return job

    def _publisher(
        self, message: Message, expires_ms: int, counters: PushCounters, store: bool
    ) -> BatchPublisher:
        recovery = self.recovery if store else None
        # Content is stored once per push even when the batches are not logged.
        content = self.recovery.content if self.recovery is not None else None
        return BatchPublisher(
            self.bus, message, expires_ms, counters, recovery, content=content, tracer=self.tracer
        )

    def _receipt(
        self, message: Message, mode: str, count: int | None, store: bool
    ) -> FanoutReceipt | None:
        """The job's receipt: listable for a `to` list within the bound (`count`); a
        stored multicast's message.unacked is due once the wait after each chunk ends.
        A broadcast's keeps counts only, and has no message.unacked: its recipients
        are the whole directory."""
        r = self.receipts
        if r is None:
            return None
        listable = count is not None and count <= r.limits.max_recipients
        unacked = r.unacked_ms and store and mode != "broadcast"
        due = (lambda: r.due_ms(self.clock.now_ms(), True)) if unacked else None
        # Only the message.unacked event reads the message's fields back.
        meta = message_meta(message, r.preview) if due is not None else {}
        return FanoutReceipt(r.log, message.push_id, mode, listable, meta, due, store)

    def _message(self, body: BroadcastIn | MulticastIn, seed: str | None) -> tuple[Message, int]:
        """The message (content encoded once) and its expiry in epoch ms (0: none).
        Under an Idempotency-Key its msg_id comes from the key, as a P2P message's: a
        request run again once its key's lease lapsed (its push service died after the
        job started, before the answer was kept) starts a second job whose copies
        clients drop."""
        now = self.clock.now_ms()
        message = new_message(body, now, seed)
        return message, (now + body.ttl_s * 1000 if body.ttl_s else 0)
