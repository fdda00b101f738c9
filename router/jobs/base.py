"""Push jobs' seam: a job's status and counters, and what the runner needs of a store."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Protocol

__all__ = ["Job", "JobStatus", "JobStore", "PushCounters"]


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class PushCounters:
    """What a broadcast or multicast job did, for its status record."""

    recipients: int = 0
    online: int = 0
    offline: int = 0
    # Batches handed to the bus; each ends `published` or, if its publish raised,
    # `failed_batches` (one still in flight when the service shuts down is neither).
    batches: int = 0
    published: int = 0
    failed_batches: int = 0
    per_group: dict[str, int] = field(default_factory=dict)


class JobStore(Protocol):
    """Where a job's status, counters and lease are kept (RedisJobStore)."""

    async def create(self, push_id: str, mode: str) -> None: ...
    async def progress(self, push_id: str, counters: PushCounters) -> None: ...
    async def finish(self, push_id: str, counters: PushCounters, error: str | None) -> None: ...
    async def get(self, push_id: str) -> Job | None: ...
