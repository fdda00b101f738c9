"""Push jobs (broadcast, multicast): their status and lease, kept in Redis."""

from router.jobs.store import Job, JobStatus, RedisJobStore

__all__ = ["Job", "JobStatus", "RedisJobStore"]
