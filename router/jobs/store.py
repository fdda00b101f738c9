"""Push jobs (broadcast, multicast) and their status, kept in Redis.

A running job holds a lease that its push service renews. Every claim of the job bumps
its epoch (the fencing token, see `router.jobs.base`), and each write below is one Lua
script that checks the epoch and the status in the same step as it writes, so a stale
holder's renewal, checkpoint or end is refused, never written over the new holder's.

When a lease lapses (its push service died or hung), `claim_lapsed` re-checks the lapse
inside its script (a renewal may have landed since the scan) and hands a resumable job
(one with a spec) to the caller to run on from its checkpoint; a job that is not
resumable, or has been taken over `max_attempts` times already, is marked failed. A job
released at a shutdown is claimable at once and its hand-over is not an attempt.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from router.jobs.base import (
    COUNTERS,
    Checkpoint,
    Claim,
    FailedBatch,
    Job,
    JobStatus,
    Lease,
    PushCounters,
    read_failed,
)
from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from shared.clock import Clock
from shared.keys import KeySchema

__all__ = ["Job", "JobStatus", "RedisJobStore"]

FINISHED_TTL_S = 7 * 24 * 3600

ORPHANED = "the push service running this job stopped before it finished"

# The common head of every fenced write: ARGV[1] is the writer's epoch.
_FENCE = """
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'queued' and status ~= 'running' then return 0 end
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return -1 end
"""

# Renewal and checkpoint: ARGV = epoch, lease end, push id, checkpoint or '', failed
# list, then the counters as field/value pairs.
_PROGRESS = (
    _FENCE
    + """
redis.call('HSET', KEYS[1], 'status', 'running', 'failed', ARGV[5], unpack(ARGV, 6))
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'checkpoint', ARGV[4]) end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
return 1
"""
)

# ARGV = epoch, push id, finished TTL, failed list, then field/value pairs (status, ...).
# What only a resume needs (the spec holds up to 64 KiB of content) goes with the end.
_FINISH = (
    _FENCE
    + """
redis.call('HSET', KEYS[1], 'failed', ARGV[4], unpack(ARGV, 5))
redis.call('HDEL', KEYS[1], 'spec', 'checkpoint', 'released')
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('ZREM', KEYS[2], ARGV[2])
return 1
"""
)

# A hand-over at shutdown: the epoch moves on, so a renewal of this holder still in
# flight is refused, and the job is claimable at once (lease end 0).
# ARGV = epoch, push id, checkpoint or '', failed list, then counter pairs.
_RELEASE = (
    _FENCE
    + """
redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'status', 'queued', 'released', '1', 'failed', ARGV[4], unpack(ARGV, 5))
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'checkpoint', ARGV[3]) end
redis.call('ZADD', KEYS[2], 0, ARGV[2])
return 1
"""
)

# A new job, leased to its creator; the latest jobs (for the dashboard) keep it among
# theirs. KEYS = job, running, recent. ARGV = lease end, push id, created at, recent
# kept, then the job's field/value pairs.
_CREATE = """
redis.call('HSET', KEYS[1], unpack(ARGV, 5))
redis.call('ZADD', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -tonumber(ARGV[4]) - 1)
return 1
"""

# One job whose lease the scan saw lapsed. ARGV = now, new lease end, max attempts,
# push id, finished TTL, the error of an orphan that cannot be resumed, that of one out
# of attempts. Returns false (live, or already ended), {0} (failed) or {epoch, spec,
# checkpoint, mode, attempts} (claimed by the caller).
_CLAIM = """
local score = redis.call('ZSCORE', KEYS[2], ARGV[4])
if not score or tonumber(score) > tonumber(ARGV[1]) then return false end
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'queued' and status ~= 'running' then
  redis.call('ZREM', KEYS[2], ARGV[4])
  return false
end
local f = redis.call('HMGET', KEYS[1], 'spec', 'attempts', 'released', 'checkpoint', 'mode')
local attempts = tonumber(f[2] or '1')
if f[3] ~= '1' then attempts = attempts + 1 end
if (not f[1]) or attempts > tonumber(ARGV[3]) then
  local reason = ARGV[6]
  if f[1] then reason = ARGV[7] end
  redis.call('HSET', KEYS[1], 'status', 'failed', 'error', reason, 'finished_at', ARGV[1])
  redis.call('HDEL', KEYS[1], 'spec', 'checkpoint', 'released')
  redis.call('EXPIRE', KEYS[1], ARGV[5])
  redis.call('ZREM', KEYS[2], ARGV[4])
  return {0}
end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'status', 'running', 'attempts', attempts, 'released', '0')
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[4])
return {epoch, f[1], f[4] or '', f[5], attempts}
"""


RECENT_KEPT = 100  # jobs:recent holds the latest this many


class RedisJobStore:
    def __init__(self, redis: RedisClient, keys: KeySchema, clock: Clock, lease_s: float = 10.0):
        self._redis = redis
        self._keys = keys
        self._clock = clock
        self._lease_ms = int(lease_s * 1000)
        self._progress = redis.register_script(_PROGRESS)
        self._finish = redis.register_script(_FINISH)
        self._release = redis.register_script(_RELEASE)
        self._claim = redis.register_script(_CLAIM)
        self._create = redis.register_script(_CREATE)

    def _job_keys(self, push_id: str) -> list[str]:
        return [self._keys.job(push_id), self._keys.jobs_running()]

    @translate_errors
    async def create(self, push_id: str, mode: str, spec: str | None = None) -> Lease:
        """Record a queued job, leased to the caller (epoch 1); `spec` makes it resumable."""
        fields_: dict[Any, Any] = {
            "push_id": push_id,
            "mode": mode,
            "status": JobStatus.QUEUED.value,
            "created_at": self._clock.now_ms(),
            "epoch": 1,
            "attempts": 1,
            **dict.fromkeys(COUNTERS, 0),
        }
        if spec is not None:
            fields_["spec"] = spec
        # Leased from the start: a process that dies before its first renewal still
        # leaves a job the reaper finds. One script, atomic on Redis Cluster too (every
        # job key has the tag {jobs}; redis-py's cluster MULTI runs each queued command
        # in a thread of its own event loop, which a failover turns into errors).
        pairs = [v for kv in fields_.items() for v in kv]
        args = [self._clock.now_ms() + self._lease_ms, push_id, fields_["created_at"]]
        keys = [*self._job_keys(push_id), self._keys.jobs_recent()]
        await self._create(keys=keys, args=[*args, RECENT_KEPT, *pairs])
        return Lease(push_id, 1)

    @translate_errors
    async def recent(self, limit: int = 20) -> list[Job]:
        """The latest jobs, newest first (those whose record has not expired)."""
        ids: list[Any] = await self._redis.zrevrange(self._keys.jobs_recent(), 0, limit - 1)
        jobs = [await self.get(str(push_id)) for push_id in ids]
        return [job for job in jobs if job is not None]

    @translate_errors
    async def progress(
        self, lease: Lease, counters: PushCounters, checkpoint: Checkpoint | None = None
    ) -> bool:
        """Record the counters (and the checkpoint) and renew the lease; False if fenced."""
        args: list[Any] = [
            lease.epoch,
            self._clock.now_ms() + self._lease_ms,
            lease.push_id,
            checkpoint.to_json() if checkpoint else "",
            _failed_json(counters.failed),
            *_pairs(counters),
        ]
        return bool(await self._progress(keys=self._job_keys(lease.push_id), args=args) == 1)

    @translate_errors
    async def finish(self, lease: Lease, counters: PushCounters, error: str | None) -> bool:
        """Record the job's end; False, and nothing written, if fenced or ended already."""
        status = JobStatus.FAILED if error else JobStatus.DONE
        args: list[Any] = [
            lease.epoch,
            lease.push_id,
            FINISHED_TTL_S,
            _failed_json(counters.failed),
            "status",
            status.value,
            "finished_at",
            self._clock.now_ms(),
            *_pairs(counters),
        ]
        if error:
            args += ["error", error]
        return bool(await self._finish(keys=self._job_keys(lease.push_id), args=args) == 1)

    @translate_errors
    async def release(self, lease: Lease, checkpoint: Checkpoint | None) -> bool:
        """Hand the job over for another process to resume from `checkpoint`."""
        counters = checkpoint.counters if checkpoint else PushCounters()
        args: list[Any] = [
            lease.epoch,
            lease.push_id,
            checkpoint.to_json() if checkpoint else "",
            _failed_json(counters.failed),
            *(_pairs(counters) if checkpoint else ()),
        ]
        return bool(await self._release(keys=self._job_keys(lease.push_id), args=args) == 1)

    @translate_errors
    async def claim_lapsed(self, max_attempts: int) -> tuple[list[Claim], int]:
        """Take over the jobs whose lease lapsed or was released: (claimed, failed).

        Claimed jobs are the caller's to run on (their new lease starts now); the ones
        that cannot be resumed, or ran out of attempts, are marked failed.
        """
        now = self._clock.now_ms()
        lapsed: list[str] = await self._redis.zrangebyscore(  # type: ignore[assignment]
            self._keys.jobs_running(), "-inf", now
        )
        claims: list[Claim] = []
        failed = 0
        for push_id in lapsed:
            got = await self._claim(
                keys=self._job_keys(push_id),
                args=[
                    now,
                    now + self._lease_ms,
                    max_attempts,
                    push_id,
                    FINISHED_TTL_S,
                    ORPHANED,
                    f"{ORPHANED}, {max_attempts} times (IMROUTE_JOB_MAX_ATTEMPTS)",
                ],
            )
            if not got:
                continue
            if got[0] == 0:
                failed += 1
                continue
            epoch, spec, checkpoint, mode, attempts = got
            claims.append(
                Claim(
                    Lease(push_id, int(epoch)),
                    mode,
                    spec,
                    Checkpoint.from_json(checkpoint) if checkpoint else None,
                    int(attempts),
                )
            )
        return claims, failed

    @translate_errors
    async def get(self, push_id: str) -> Job | None:
        raw: dict[Any, Any] = await self._redis.hgetall(self._keys.job(push_id))
        if not raw:
            return None
        return Job(
            push_id=raw["push_id"],
            mode=raw["mode"],
            status=JobStatus(raw["status"]),
            error=raw.get("error"),
            created_at=int(raw["created_at"]),
            finished_at=int(raw["finished_at"]) if "finished_at" in raw else None,
            attempts=int(raw.get("attempts", 1)),
            failed=tuple(read_failed(json.loads(raw.get("failed") or "[]"))),
            **{name: int(raw.get(name, 0)) for name in COUNTERS},
        )


def _pairs(counters: PushCounters) -> list[Any]:
    pairs: list[Any] = []
    for name in COUNTERS:
        pairs += [name, getattr(counters, name)]
    return pairs


def _failed_json(failed: list[FailedBatch]) -> str:
    return json.dumps([asdict(f) for f in failed], separators=(",", ":"))
