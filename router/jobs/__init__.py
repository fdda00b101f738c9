"""Push jobs (broadcast, multicast): their status and lease in Redis, and the reaper.

- `base`: a job, its counters, checkpoint and lease (fencing epoch); the JobStore seam.
- `store`: the job records, their counters, checkpoints and leases (`RedisJobStore`).
- `reaper`: takes over the jobs whose lease lapsed (their push service died).
- `specs`: what a job (a broadcast, a multicast) keeps so another process can run it on.
"""

# No re-exports: importing one module of the package loads only what it needs.
