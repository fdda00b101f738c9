"""Push jobs (broadcast, multicast): their status and lease in Redis, and the reaper.

- `store`: the job records, their counters and leases (`RedisJobStore`).
- `reaper`: fails the jobs whose lease lapsed (their push service died).
"""

from router.jobs.reaper import Reapable, reap_forever, reaping
from router.jobs.store import Job, JobStatus, RedisJobStore

__all__ = ["Job", "JobStatus", "Reapable", "RedisJobStore", "reap_forever", "reaping"]
