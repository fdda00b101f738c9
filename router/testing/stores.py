"""In-memory stand-ins for the stores of what pushes leave behind (recovery log, receipts,
jobs, the dashboard's counts), behind the router's seams: with `router.testing.routes`
and `push_service.testing`, the push service's HTTP routes run without Redis (tests/api).
Records in dicts, by the real stores' rules (tests/integration/test_store_contract.py runs
the same scenarios on both); no TTLs and no failures: those are tested on the real stores,
against real Redis."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from router.jobs.base import (
    ORPHANED,
    Checkpoint,
    Claim,
    Job,
    JobStatus,
    Lease,
    PushCounters,
    out_of_attempts,
)
from router.receipts.base import (
    ACKED,
    DELIVERED,
    EXPIRED,
    QUEUED,
    Counts,
    NewReceipt,
    RecipientPage,
    derive,
    estimated,
    listed,
    moves_up,
    recipient_page,
    stored_value,
    tally,
    unwritten,
)
from router.recovery.base import ContentWrites
from shared.clock import Clock
from shared.keys import slot_tagged
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
    """The recovery log's writes: per-user logs (each user's inbox is the log after the
    position its devices acked, the last `inbox_max` of it), per-topic seqs."""

    seqs: dict[str, int] = field(default_factory=dict)  # uid or topic -> last seq
    logs: dict[str, dict[int, Message]] = field(default_factory=dict)  # uid -> seq -> msg
    acked: dict[str, int] = field(default_factory=dict)  # uid -> acked up to this seq
    floors: dict[str, int] = field(default_factory=dict)  # uid -> the bound pushed out to
    batches: dict[str, list[gateway_pb2.Batch]] = field(default_factory=dict)
    inbox_max: int = 100  # IMROUTE_INBOX_MAX

    @property
    def content(self) -> ContentWrites:
        return _NoContentStore()

    def _next(self, name: str) -> int:
        self.seqs[name] = self.seqs.get(name, 0) + 1
        return self.seqs[name]

    def inbox(self, uid: str) -> dict[int, Message]:
        """What waits for `uid`'s ack: its log after the acked position and after what
        the inbox bound pushed out."""
        start = self._start(uid)
        return {seq: m for seq, m in self.logs.get(uid, {}).items() if seq > start}

    def cursor(self, uid: str) -> tuple[int, int, int] | None:
        """`uid`'s cursor as a derived receipt reads it (`router.receipts.base.Cursor`:
        epoch 0, acked, floor); None: no log."""
        if f"user:{uid}" not in self.seqs:
            return None
        return 0, self.acked.get(uid, 0), self.floors.get(uid, 0)

    def _start(self, uid: str) -> int:
        """The seq `uid`'s inbox starts after: acked, or pushed out by the bound."""
        return max(self.acked.get(uid, 0), self.floors.get(uid, 0))

    async def append_queued(
        self, message: Message, uids: Sequence[str], expires_ms: int
    ) -> tuple[list[int], int]:
        seqs = []
        dropped = 0
        for uid in uids:
            seq = self._next(f"user:{uid}")
            self.logs.setdefault(uid, {})[seq] = message
            if seq - self._start(uid) > self.inbox_max:
                self.floors[uid] = seq - self.inbox_max
                dropped += 1
            seqs.append(seq)
        return seqs, dropped

    async def append_queued_many(
        self, items: Sequence[tuple[Message, Sequence[str], int]]
    ) -> list[tuple[list[int], int]]:
        return [await self.append_queued(m, uids, exp) for m, uids, exp in items]

    async def append_batch(self, topic: str, batch: gateway_pb2.Batch) -> int:
        self.batches.setdefault(topic, []).append(batch)
        return self._next(f"topic:{topic}")

    async def ack(self, wanted: Sequence[tuple[str, int]]) -> list[None]:
        for uid, seq in wanted:
            head = self.seqs.get(f"user:{uid}", 0)
            self.acked[uid] = max(self.acked.get(uid, 0), min(seq, head))
        return [None] * len(wanted)


@dataclass
class _Receipt:
    """One receipt, field for field as the Redis store keeps it (`router.receipts.store`),
    with exact sets where Redis estimates distinct uids."""

    mode: str | None = None  # None: started by an ack that came before the record
    recipients: int = 0
    online: int = 0
    listable: bool = True
    kept: bool = True
    counters: dict[str, int] = field(default_factory=lambda: tally(()))
    states: dict[str, str] = field(default_factory=dict)  # listable: uid -> state
    acked: set[str] = field(default_factory=set)  # counts-only
    delivered: set[str] = field(default_factory=set)  # counts-only
    pending: set[str] = field(default_factory=set)  # counts-only: a message.unacked due
    meta: dict[str, str] = field(default_factory=dict)
    # A slot-tagged push's: each recipient's position, from which its ack is derived.
    positions: dict[str, int] = field(default_factory=dict)

    def count(self, states: Mapping[str, str], due_ms: int) -> None:
        """A counts-only record's `states`: acked and delivered uids, expired counted,
        the unacked pending while a message.unacked is due (`due_ms`)."""
        for uid, state in states.items():
            if state == ACKED:
                self.acked.add(uid)
                self.pending.discard(uid)
            elif due_ms:
                self.pending.add(uid)
            if state == EXPIRED:
                self.counters[EXPIRED] += 1
            elif state != QUEUED:
                self.delivered.add(uid)

    def move(self, uid: str, new: str) -> None:
        old = self.states.get(uid)
        if moves_up(old, new):
            self.states[uid] = new
            self.counters[new] += 1
            if old is not None:
                self.counters[old] -= 1


class MemoryReceiptStore:
    """Receipts in a dict, by the Redis store's rules (its scripts, step by step): the
    router's writes, the gateways' marks and the reads; states only move up, an ack that
    comes before the record starts the receipt, and a counts-only receipt counts distinct
    uids exactly (Redis: about 1 % off)."""

    def __init__(self, recovery: MemoryRecoveryLog | None = None) -> None:
        """`recovery`: the users' logs whose cursors a slot-tagged push's states follow."""
        self.receipts: dict[str, _Receipt] = {}
        self._recovery = recovery

    def _states(self, r: _Receipt) -> dict[str, str]:
        """Its recipients' states, a slot-tagged push's derived from its users' cursors."""
        log = self._recovery
        if not r.positions or log is None:
            return r.states
        return {
            uid: derive(stored_value(state, r.positions[uid]), log.cursor(uid))
            if uid in r.positions
            else state
            for uid, state in r.states.items()
        }

    async def record(self, receipt: NewReceipt, listable: bool, due_ms: int = 0) -> None:
        if listable and receipt.positions and slot_tagged(receipt.push_id):
            # One HSET in Redis (counters unused), over the values; marks that came
            # before it wait beside them, and are read with them (`with_early`).
            early = self.receipts.get(receipt.push_id)
            r = self.receipts[receipt.push_id] = _Receipt(
                "p2p", receipt.recipients, receipt.online, True
            )
            r.meta.update(receipt.meta)
            r.states = dict(receipt.states)
            r.positions = dict(receipt.positions)
            if early is not None and early.mode is None:
                for uid, state in early.states.items():
                    if moves_up(r.states.get(uid), state):
                        r.states[uid] = state
            return
        r = self.receipts.setdefault(receipt.push_id, _Receipt())
        # Marks that came before the first record (an early ack started it as listable).
        marks = r.states if r.mode is None and not listable else {}
        r.mode, r.recipients, r.online = receipt.mode, receipt.recipients, receipt.online
        r.listable = listable
        r.kept = r.kept and (receipt.kept or listable)
        r.meta.update(receipt.meta)
        if listable:
            for uid, state in receipt.states.items():
                r.move(uid, state)
            return
        r.count(receipt.states, due_ms)
        if marks:  # counted as the counts-only receipt counts them; expired stay counted
            r.states = {}
            r.count({u: s for u, s in marks.items() if s != EXPIRED}, 0)

    async def record_many(self, receipts: Sequence[tuple[NewReceipt, bool, int]]) -> None:
        for receipt, listable, due_ms in receipts:
            await self.record(receipt, listable, due_ms)

    async def mark(self, state: str, by_push: Mapping[str, Sequence[str]]) -> None:
        for push_id, uids in by_push.items():
            r = self.receipts.get(push_id)
            if r is None:
                if state != ACKED:
                    continue
                r = self.receipts[push_id] = _Receipt()  # listable until recorded
            if r.listable:
                for uid in uids:
                    r.move(uid, state)
            elif state == EXPIRED:
                r.counters[EXPIRED] += len(uids)  # counted, not distinct, as in Redis
            else:
                if state == ACKED:
                    r.acked.update(uids)
                    r.pending.difference_update(uids)
                r.delivered.update(uids)

    async def counts(self, push_id: str) -> Counts | None:
        r = self.receipts.get(push_id)
        if r is None or r.mode is None:
            return None
        c = r.counters
        if r.positions:  # counted from its states, derived
            c = tally(self._states(r).values())
        if r.listable:
            acked, delivered, queued = c[ACKED], c[DELIVERED] + c[ACKED], c[QUEUED]
        else:
            acked, delivered = estimated(r.recipients, len(r.acked), len(r.delivered))
            queued = unwritten(r.recipients, delivered, c[EXPIRED])
        return Counts(
            r.mode, r.recipients, r.online, delivered, acked, queued, c[EXPIRED], r.listable, r.kept
        )

    async def states(self, push_id: str, uids: Sequence[str]) -> dict[str, str]:
        r = self.receipts.get(push_id)
        held = {} if r is None else self._states(r)
        return {u: held[u] for u in uids if u in held}

    async def page(self, push_id: str, state: str, cursor: str | None, limit: int) -> RecipientPage:
        wanted = listed(state)
        r = self.receipts.get(push_id)
        return recipient_page({} if r is None else self._states(r), wanted, cursor, limit)

    async def meta(self, push_id: str) -> dict[str, str]:
        r = self.receipts.get(push_id)
        return {} if r is None else dict(r.meta)

    async def claim_due(self, now_ms: int, lease_ms: int, limit: int) -> list[str]:
        return []  # message.unacked is never due: webhooks run on Redis only

    async def unacked(self, push_id: str) -> list[str]:
        r = self.receipts.get(push_id)
        if r is None:
            return []
        if not r.listable:
            return sorted(r.pending)
        return sorted(u for u, s in self._states(r).items() if s != ACKED)

    async def settle(self, push_id: str) -> None:
        r = self.receipts.get(push_id)
        if r is not None:
            r.pending.clear()


class MemoryJobStore:
    """Job records in a dict, by the Redis store's rules (its scripts, step by step):
    fenced by epoch, a claim or a release moves the epoch on, a lease lapses on the
    clock, and a hand-over at shutdown is claimable at once and not an attempt."""

    def __init__(self, clock: Clock, lease_s: float = 10.0) -> None:
        self._clock = clock
        self._lease_ms = int(lease_s * 1000)
        self.jobs: dict[str, Job] = {}
        self._epochs: dict[str, int] = {}
        self._specs: dict[str, str] = {}
        self._checkpoints: dict[str, Checkpoint] = {}
        self._released: set[str] = set()
        self._leases: dict[str, int] = {}  # running jobs: push id -> lease end (ms)

    async def create(self, push_id: str, mode: str, spec: bytes | None = None) -> Lease:
        now = self._clock.now_ms()
        self.jobs[push_id] = Job(push_id, mode, JobStatus.QUEUED, 0, 0, 0, 0, 0, 0, None, now, None)
        self._epochs[push_id] = 1
        if spec is not None:
            self._specs[push_id] = spec.decode()  # as a Redis client decodes it
        self._leases[push_id] = now + self._lease_ms
        return Lease(push_id, 1)

    def _holds(self, lease: Lease) -> bool:
        job = self.jobs.get(lease.push_id)
        return (
            job is not None
            and job.status in (JobStatus.QUEUED, JobStatus.RUNNING)
            and self._epochs.get(lease.push_id) == lease.epoch
        )

    def _write(self, push_id: str, counters: PushCounters | None, **changes: object) -> None:
        if counters is not None:
            c = counters
            changes.update(
                recipients=c.recipients, online=c.online, offline=c.offline, batches=c.batches,
                published=c.published, failed_batches=c.failed_batches, failed=tuple(c.failed),
            )  # fmt: skip
        self.jobs[push_id] = replace(self.jobs[push_id], **changes)  # type: ignore[arg-type]

    def _end(self, push_id: str) -> None:
        """What only a resume needs goes with the job's end."""
        self._specs.pop(push_id, None)
        self._checkpoints.pop(push_id, None)
        self._released.discard(push_id)
        self._leases.pop(push_id, None)

    async def progress(
        self, lease: Lease, counters: PushCounters, checkpoint: Checkpoint | None = None
    ) -> bool:
        if not self._holds(lease):
            return False
        self._write(lease.push_id, counters, status=JobStatus.RUNNING)
        if checkpoint is not None:
            self._checkpoints[lease.push_id] = checkpoint
        self._leases[lease.push_id] = self._clock.now_ms() + self._lease_ms
        return True

    async def finish(self, lease: Lease, counters: PushCounters, error: str | None) -> bool:
        if not self._holds(lease):
            return False
        status = JobStatus.FAILED if error else JobStatus.DONE
        changes: dict[str, object] = {"status": status, "finished_at": self._clock.now_ms()}
        if error:
            changes["error"] = error
        self._write(lease.push_id, counters, **changes)
        self._end(lease.push_id)
        return True

    async def release(self, lease: Lease, checkpoint: Checkpoint | None) -> bool:
        if not self._holds(lease):
            return False
        push_id = lease.push_id
        self._epochs[push_id] += 1  # a renewal of this holder still in flight is refused
        if checkpoint is None:  # the counters stay; the failed list does not
            self._write(push_id, None, status=JobStatus.QUEUED, failed=())
        else:
            self._write(push_id, checkpoint.counters, status=JobStatus.QUEUED)
            self._checkpoints[push_id] = checkpoint
        self._released.add(push_id)
        self._leases[push_id] = 0  # claimable at once
        return True

    async def claim_lapsed(self, max_attempts: int) -> tuple[list[Claim], int]:
        now = self._clock.now_ms()
        lapsed = sorted((end, p) for p, end in self._leases.items() if end <= now)
        claims: list[Claim] = []
        failed = 0
        for _, push_id in lapsed:
            job = self.jobs[push_id]
            if job.status not in (JobStatus.QUEUED, JobStatus.RUNNING):
                del self._leases[push_id]
                continue
            attempts = job.attempts + (0 if push_id in self._released else 1)
            spec = self._specs.get(push_id)
            if spec is None or attempts > max_attempts:
                error = ORPHANED if spec is None else out_of_attempts(max_attempts)
                self._write(push_id, None, status=JobStatus.FAILED, error=error, finished_at=now)
                self._end(push_id)
                failed += 1
                continue
            self._epochs[push_id] += 1
            self._write(push_id, None, status=JobStatus.RUNNING, attempts=attempts)
            self._released.discard(push_id)
            self._leases[push_id] = now + self._lease_ms
            lease = Lease(push_id, self._epochs[push_id])
            claims.append(Claim(lease, job.mode, spec, self._checkpoints.get(push_id), attempts))
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
