"""In-memory stand-ins for the stores of what pushes leave behind (recovery log, receipts,
jobs, the dashboard's counts), behind the router's seams: with `router.testing.routes`
and `push_service.testing`, the push service's HTTP routes run without Redis (tests/api).
Records in dicts, with the states' rules; no TTLs, no lapsing leases, no failures: those
are tested on the real stores, against real Redis."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from router.jobs.base import Checkpoint, Claim, Job, JobStatus, Lease, PushCounters
from router.receipts.base import (
    ACKED,
    DELIVERED,
    EXPIRED,
    QUEUED,
    STATES,
    Counts,
    NewReceipt,
    RecipientPage,
)
from router.recovery.base import ContentWrites
from shared.clock import Clock
from shared.errors import InvalidInput
from shared.models import Message
from shared.proto import gateway_pb2

__all__ = [
    "MemoryJobStore",
    "MemoryReceiptStore",
    "MemoryRecoveryLog",
    "MemoryStatsStore",
]


class _NoContentStore:
    """Every push carries its content in its batches (nothing stored once)."""

    def stores(self, content: bytes) -> bool:
        return False

    async def hold(self, msg_id: str, content: bytes) -> None:
        return None


@dataclass
class MemoryRecoveryLog:
    """The recovery log's writes: per-user seqs and inboxes, per-topic seqs."""

    seqs: dict[str, int] = field(default_factory=dict)  # uid or topic -> last seq
    inboxes: dict[str, dict[int, Message]] = field(default_factory=dict)  # uid -> seq -> msg
    batches: dict[str, list[gateway_pb2.Batch]] = field(default_factory=dict)

    @property
    def content(self) -> ContentWrites:
        return _NoContentStore()

    def _next(self, name: str) -> int:
        self.seqs[name] = self.seqs.get(name, 0) + 1
        return self.seqs[name]

    async def append_p2p(self, message: Message, uids: Sequence[str], expires_ms: int) -> list[int]:
        return [self._next(f"user:{u}") for u in uids]

    async def append_queued(
        self, message: Message, uids: Sequence[str], expires_ms: int
    ) -> tuple[list[int], int]:
        seqs = await self.append_p2p(message, uids, expires_ms)
        dropped = await self.queue(message, expires_ms, dict(zip(uids, seqs, strict=True)))
        return seqs, dropped

    async def append_queued_many(
        self, items: Sequence[tuple[Message, Sequence[str], int]]
    ) -> list[tuple[list[int], int]]:
        return [await self.append_queued(m, uids, exp) for m, uids, exp in items]

    async def queue(self, message: Message, expires_ms: int, seqs: Mapping[str, int]) -> int:
        for uid, seq in seqs.items():
            self.inboxes.setdefault(uid, {})[seq] = message
        return 0

    async def append_batch(self, topic: str, batch: gateway_pb2.Batch) -> int:
        self.batches.setdefault(topic, []).append(batch)
        return self._next(f"topic:{topic}")

    async def forget_inboxes(self, wanted: Sequence[tuple[str, Sequence[int]]]) -> list[None]:
        for uid, seqs in wanted:
            for seq in seqs:
                self.inboxes.get(uid, {}).pop(seq, None)
        return [None] * len(wanted)


@dataclass
class _Receipt:
    mode: str
    recipients: int
    online: int
    listable: bool
    queued: int = 0  # counts-only
    states: dict[str, str] = field(default_factory=dict)  # listable: uid -> state
    marked: dict[str, set[str]] = field(default_factory=dict)  # counts-only: state -> uids
    meta: dict[str, str] = field(default_factory=dict)


class MemoryReceiptStore:
    """Receipts in a dict: the router's writes, the gateways' marks and the reads, with
    states that only move up; a counts-only receipt counts distinct uids exactly."""

    def __init__(self) -> None:
        self.receipts: dict[str, _Receipt] = {}

    async def record(self, receipt: NewReceipt, listable: bool, due_ms: int = 0) -> None:
        r = self.receipts.get(receipt.push_id)
        if r is None:
            r = self.receipts[receipt.push_id] = _Receipt(
                receipt.mode, receipt.recipients, receipt.online, listable
            )
        r.meta.update(receipt.meta)
        if not listable:
            r.queued += receipt.recipients - receipt.online
        for uid, state in receipt.states.items():
            if listable:
                r.states[uid] = _higher(r.states.get(uid), state)

    async def record_many(self, receipts: Sequence[tuple[NewReceipt, bool, int]]) -> None:
        for receipt, listable, due_ms in receipts:
            await self.record(receipt, listable, due_ms)

    async def add(self, push_id: str, recipients: int, online: int, queued: int) -> None:
        r = self.receipts.setdefault(push_id, _Receipt("broadcast", 0, 0, False))
        r.recipients += recipients
        r.online += online
        r.queued += queued

    async def mark(self, state: str, by_push: Mapping[str, Sequence[str]]) -> None:
        for push_id, uids in by_push.items():
            r = self.receipts.get(push_id)
            if r is None:
                continue
            for uid in uids:
                if r.listable:
                    r.states[uid] = _higher(r.states.get(uid), state)
                else:
                    r.marked.setdefault(state, set()).add(uid)

    async def counts(self, push_id: str) -> Counts | None:
        r = self.receipts.get(push_id)
        if r is None:
            return None
        if r.listable:
            n = {s: sum(1 for v in r.states.values() if v == s) for s in STATES}
            acked, delivered = n[ACKED], n[DELIVERED] + n[ACKED]
            queued, expired = n[QUEUED], n[EXPIRED]
        else:
            acked = len(r.marked.get(ACKED, ()))
            delivered = len(r.marked.get(DELIVERED, set()) | r.marked.get(ACKED, set()))
            queued, expired = r.queued, len(r.marked.get(EXPIRED, ()))
        return Counts(r.mode, r.recipients, r.online, delivered, acked, queued, expired, r.listable)

    async def states(self, push_id: str, uids: Sequence[str]) -> dict[str, str]:
        r = self.receipts.get(push_id)
        held = {} if r is None else r.states
        return {u: held[u] for u in uids if u in held}

    async def page(self, push_id: str, state: str, cursor: str | None, limit: int) -> RecipientPage:
        wanted = {"acked": {ACKED}, "unacked": {QUEUED, DELIVERED}, "queued": {QUEUED}}.get(state)
        if wanted is None:
            raise InvalidInput("state", "must be acked, unacked or queued")
        r = self.receipts.get(push_id)
        held = {} if r is None else r.states
        uids = sorted(u for u, s in held.items() if s in wanted and (cursor is None or u > cursor))
        page = uids[:limit]
        return RecipientPage(page, page[-1] if len(uids) > limit else None)

    async def meta(self, push_id: str) -> dict[str, str]:
        r = self.receipts.get(push_id)
        return {} if r is None else dict(r.meta)

    async def claim_due(self, now_ms: int, lease_ms: int, limit: int) -> list[str]:
        return []  # message.unacked is never due: webhooks run on Redis only

    async def unacked(self, push_id: str) -> list[str]:
        r = self.receipts.get(push_id)
        return [] if r is None else sorted(u for u, s in r.states.items() if s != ACKED)

    async def settle(self, push_id: str) -> None:
        return None


def _higher(old: str | None, new: str) -> str:
    """A recipient's state only moves up (queued -> expired / delivered -> acked)."""
    if old is None:
        return new
    if old == EXPIRED and new == DELIVERED:
        return old
    return new if STATES.index(new) > STATES.index(old) else old


class MemoryJobStore:
    """Job records in a dict, fenced by epoch; a released job is claimed again by the
    next `claim_lapsed` (leases never lapse by time here)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.jobs: dict[str, Job] = {}
        self._epochs: dict[str, int] = {}
        self._specs: dict[str, str | None] = {}
        self._released: dict[str, Checkpoint | None] = {}

    async def create(self, push_id: str, mode: str, spec: str | None = None) -> Lease:
        now = self._clock.now_ms()
        self.jobs[push_id] = Job(push_id, mode, JobStatus.QUEUED, 0, 0, 0, 0, 0, 0, None, now, None)
        self._epochs[push_id] = 1
        self._specs[push_id] = spec
        return Lease(push_id, 1)

    def _holds(self, lease: Lease) -> bool:
        job = self.jobs.get(lease.push_id)
        return (
            job is not None
            and self._epochs.get(lease.push_id) == lease.epoch
            and job.status not in (JobStatus.DONE, JobStatus.FAILED)
        )

    def _write(self, push_id: str, counters: PushCounters, **changes: object) -> None:
        c = counters
        self.jobs[push_id] = replace(
            self.jobs[push_id],
            recipients=c.recipients, online=c.online, offline=c.offline, batches=c.batches,
            published=c.published, failed_batches=c.failed_batches, failed=tuple(c.failed),
            **changes,  # type: ignore[arg-type]
        )  # fmt: skip

    async def progress(
        self, lease: Lease, counters: PushCounters, checkpoint: Checkpoint | None = None
    ) -> bool:
        if not self._holds(lease):
            return False
        self._write(lease.push_id, counters, status=JobStatus.RUNNING)
        return True

    async def finish(self, lease: Lease, counters: PushCounters, error: str | None) -> bool:
        if not self._holds(lease):
            return False
        status = JobStatus.FAILED if error else JobStatus.DONE
        now = self._clock.now_ms()
        self._write(lease.push_id, counters, status=status, error=error, finished_at=now)
        return True

    async def release(self, lease: Lease, checkpoint: Checkpoint | None) -> bool:
        if not self._holds(lease):
            return False
        self._released[lease.push_id] = checkpoint
        counters = checkpoint.counters if checkpoint else PushCounters()
        self._write(lease.push_id, counters, status=JobStatus.QUEUED)
        return True

    async def claim_lapsed(self, max_attempts: int) -> tuple[list[Claim], int]:
        claims: list[Claim] = []
        failed = 0
        for push_id, checkpoint in list(self._released.items()):
            del self._released[push_id]
            job, spec = self.jobs[push_id], self._specs.get(push_id)
            if spec is None or job.attempts >= max_attempts:
                self.jobs[push_id] = replace(job, status=JobStatus.FAILED, error="orphaned")
                failed += 1
                continue
            self._epochs[push_id] += 1
            self.jobs[push_id] = replace(job, attempts=job.attempts + 1)
            lease = Lease(push_id, self._epochs[push_id])
            claims.append(Claim(lease, job.mode, spec, checkpoint, job.attempts + 1))
        return claims, failed

    async def get(self, push_id: str) -> Job | None:
        return self.jobs.get(push_id)

    async def recent(self, limit: int = 20) -> list[Job]:
        return sorted(self.jobs.values(), key=lambda j: j.created_at, reverse=True)[:limit]


class MemoryStatsStore:
    """The dashboard's counts per interval."""

    def __init__(self, bucket_ms: int = 1000) -> None:
        self.bucket_ms = bucket_ms
        self.buckets: dict[int, dict[str, int]] = {}

    def start_of(self, at_ms: int) -> int:
        return at_ms - at_ms % self.bucket_ms

    async def add(self, at_ms: int, counts: Mapping[str, int]) -> None:
        bucket = self.buckets.setdefault(self.start_of(at_ms), {})
        for name, n in counts.items():
            bucket[name] = bucket.get(name, 0) + n

    async def read(self, since_ms: int, until_ms: int) -> list[tuple[int, dict[str, int]]]:
        starts = range(self.start_of(since_ms), until_ms + 1, self.bucket_ms)
        return [(s, dict(self.buckets.get(s, {}))) for s in starts]

    async def sums(self, since_ms: int, until_ms: int, names: Sequence[str]) -> dict[str, int]:
        out = dict.fromkeys(names, 0)
        for _, counts in await self.read(since_ms, until_ms):
            for name in names:
                out[name] += counts.get(name, 0)
        return out
