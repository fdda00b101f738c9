"""Push jobs (broadcast, multicast): their status and lease in Redis, and the reaper.

- `store`: the job records, their counters and leases (`RedisJobStore`).
- `reaper`: fails the jobs whose lease lapsed (their push service died).
"""

# No re-exports: importing one module of the package loads only what it needs.
