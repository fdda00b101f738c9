"""Push jobs' seam: a job's status, counters and checkpoint, and what the runner needs of a store.

A job is run by one process at a time, the holder of its lease. Each claim of a job (its
creation, or a take-over after the lease lapsed or was released) increments the job's
epoch, the fencing token: the store refuses every write that carries an older epoch, so a
process that lost its lease (paused, partitioned, slow to notice its own shutdown) can
never overwrite what the new holder wrote.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any, Protocol

from shared.errors import InvalidInput

__all__ = [
    "MAX_FAILED_LISTED",
    "ORPHANED",
    "Checkpoint",
    "Claim",
    "FailedBatch",
    "Job",
    "JobStatus",
    "JobStore",
    "Lease",
    "PushCounters",
    "RecentJobs",
    "read_failed",
]

# A job's record lists its first failed batches, so an operator can re-send them; the
# count (`failed_batches`) is always complete.
MAX_FAILED_LISTED = 100

# The errors a job's store writes when a take-over finds its holder gone.
ORPHANED = "the push service running this job stopped before it finished"


def out_of_attempts(max_attempts: int) -> str:
    """The error of a job taken over `max_attempts` times already."""
    return f"{ORPHANED}, {max_attempts} times (IMROUTE_JOB_MAX_ATTEMPTS)"


class JobStatus(StrEnum):
    QUEUED = "queued"  # created, or handed over at a shutdown, and not yet (re)claimed
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class FailedBatch:
    """A batch that could not be published after its retries."""

    topic: str
    uids: int
    # a broadcast page: the uid the page starts after (None: the first page, or everyone)
    after: str | None
    error: str


@dataclass(frozen=True, slots=True)
class Job:
    push_id: str
    mode: str
    status: JobStatus
    recipients: int
    online: int
    offline: int
    batches: int
    published: int
    failed_batches: int
    error: str | None
    created_at: int
    finished_at: int | None
    attempts: int = 1
    failed: tuple[FailedBatch, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class PushCounters:
    """What a broadcast or multicast job did, for its status record."""

    recipients: int = 0
    online: int = 0
    offline: int = 0
    # Batches handed to the bus; each ends `published` or, if its publish raised after
    # its retries, `failed_batches` (one still in flight when the service shuts down is
    # neither).
    batches: int = 0
    published: int = 0
    failed_batches: int = 0
    per_group: dict[str, int] = field(default_factory=dict)
    failed: list[FailedBatch] = field(default_factory=list)  # the first MAX_FAILED_LISTED
    consecutive_failures: int = 0  # not recorded: ends a push whose bus is down

    def copy(self) -> PushCounters:
        return PushCounters(
            self.recipients,
            self.online,
            self.offline,
            self.batches,
            self.published,
            self.failed_batches,
            dict(self.per_group),
            list(self.failed),
        )


COUNTERS = ("recipients", "online", "offline", "batches", "published", "failed_batches")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """How far a resumable job got: everything up to it was published or counted failed.

    `after` is the last directory uid of the last page done (None before the first),
    `pages` how many pages were done; `counters` are the job's counters at that point, so
    a process that resumes there counts on from them.
    """

    after: str | None
    pages: int
    counters: PushCounters

    def to_json(self) -> str:
        c = self.counters
        return json.dumps(
            {
                "after": self.after,
                "pages": self.pages,
                "counters": {name: getattr(c, name) for name in COUNTERS},
                "failed": [asdict(f) for f in c.failed],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, raw: str) -> Checkpoint:
        try:
            data = json.loads(raw)
            counters = PushCounters(failed=read_failed(data.get("failed", [])))
            for name in COUNTERS:
                setattr(counters, name, int(data["counters"][name]))
            return cls(data["after"], int(data["pages"]), counters)
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidInput("checkpoint", f"unreadable: {exc}") from None


def read_failed(raw: object) -> list[FailedBatch]:
    """The failed batches of a record (a JSON list of objects)."""
    if not isinstance(raw, list):
        raise TypeError("failed: not a list")
    names = {f.name for f in fields(FailedBatch)}
    return [FailedBatch(**{k: v for k, v in item.items() if k in names}) for item in raw]


@dataclass(frozen=True, slots=True)
class Lease:
    """The right to write a job's record: its push id and the epoch of this claim."""

    push_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Claim:
    """A job this process took over: its lease, what it is and where it stopped."""

    lease: Lease
    mode: str
    spec: str  # what the job's kind needs to run it (router.jobs.specs)
    checkpoint: Checkpoint | None
    attempts: int


class JobStore(Protocol):
    """Where a job's status, counters and lease are kept (RedisJobStore).

    Every write with a lease returns False, and changes nothing, when that lease is no
    longer the job's (another process claimed it) or the job already ended.
    """

    async def create(self, push_id: str, mode: str, spec: bytes | None = None) -> Lease: ...
    async def progress(
        self, lease: Lease, counters: PushCounters, checkpoint: Checkpoint | None = None
    ) -> bool: ...
    async def finish(self, lease: Lease, counters: PushCounters, error: str | None) -> bool: ...
    async def release(self, lease: Lease, checkpoint: Checkpoint | None) -> bool: ...
    async def claim_lapsed(self, max_attempts: int) -> tuple[list[Claim], int]: ...
    async def get(self, push_id: str) -> Job | None: ...


class RecentJobs(Protocol):
    async def recent(self, limit: int = 20) -> list[Job]:
        """The latest jobs, newest first."""
        ...
