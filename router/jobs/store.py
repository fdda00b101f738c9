"""Push jobs (broadcast, multicast) and their status, kept in Redis.

A running job holds a lease that its push service renews; if that process dies, the
lease lapses and the reaper marks the job failed with a reason, so no job is left
"running" forever. Job state therefore survives a push-service restart.
"""

from __future__ import annotations

from typing import Any

from router.jobs.base import Job, JobStatus, PushCounters
from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from shared.clock import Clock
from shared.keys import KeySchema

__all__ = ["Job", "JobStatus", "RedisJobStore"]

FINISHED_TTL_S = 7 * 24 * 3600

# Marks a running job failed only if it is still running (a late renewal or finish of
# the same job must not be overwritten, nor a finished job resurrected).
_REAP = """
if redis.call('HGET', KEYS[1], 'status') == 'running' then
  redis.call('HSET', KEYS[1], 'status', 'failed', 'error', ARGV[1], 'finished_at', ARGV[2])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('ZREM', KEYS[2], ARGV[4])
  return 1
end
redis.call('ZREM', KEYS[2], ARGV[4])
return 0
"""


# A renewal never overwrites an end: a cancelled renewal may still reach Redis after
# the job finished, over another connection.
_PROGRESS = """
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'queued' and status ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'running', unpack(ARGV, 3))
redis.call('ZADD', KEYS[2], ARGV[1], ARGV[2])
return 1
"""


_COUNTERS = ("recipients", "online", "offline", "batches", "published", "failed_batches")


class RedisJobStore:
    def __init__(self, redis: RedisClient, keys: KeySchema, clock: Clock, lease_s: float = 10.0):
        self._redis = redis
        self._keys = keys
        self._clock = clock
        self._lease_ms = int(lease_s * 1000)
        self._reap = redis.register_script(_REAP)
        self._progress = redis.register_script(_PROGRESS)

    @translate_errors
    async def create(self, push_id: str, mode: str) -> None:
        fields_: dict[Any, Any] = {
            "push_id": push_id,
            "mode": mode,
            "status": JobStatus.QUEUED.value,
            "created_at": self._clock.now_ms(),
            **dict.fromkeys(_COUNTERS, 0),
        }
        await self._redis.hset(self._keys.job(push_id), mapping=fields_)

    @translate_errors
    async def progress(self, push_id: str, counters: PushCounters) -> None:
        """Record the counters and renew the lease (status running)."""
        args: list[Any] = [self._clock.now_ms() + self._lease_ms, push_id]
        for name, value in _counter_fields(counters).items():
            args += [name, value]
        await self._progress(keys=[self._keys.job(push_id), self._keys.jobs_running()], args=args)

    @translate_errors
    async def finish(self, push_id: str, counters: PushCounters, error: str | None) -> None:
        status = JobStatus.FAILED if error else JobStatus.DONE
        # redis-py's mapping type is invariant in its keys; these are plain str -> str|int.
        mapping: dict[Any, Any] = {
            "status": status.value,
            "finished_at": self._clock.now_ms(),
            **_counter_fields(counters),
        }
        if error:
            mapping["error"] = error
        pipe = self._redis.pipeline(transaction=False)
        pipe.hset(self._keys.job(push_id), mapping=mapping)
        pipe.expire(self._keys.job(push_id), FINISHED_TTL_S)
        pipe.zrem(self._keys.jobs_running(), push_id)
        await pipe.execute()

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
            **{name: int(raw.get(name, 0)) for name in _COUNTERS},
        )

    @translate_errors
    async def reap(self) -> int:
        """Fail the running jobs whose lease lapsed (their push service died); how many."""
        now = self._clock.now_ms()
        orphans: list[str] = await self._redis.zrangebyscore(  # type: ignore[assignment]
            self._keys.jobs_running(), "-inf", now
        )
        failed = 0
        for push_id in orphans:
            failed += await self._reap(
                keys=[self._keys.job(push_id), self._keys.jobs_running()],
                args=[
                    "the push service running this job stopped before it finished",
                    now,
                    FINISHED_TTL_S,
                    push_id,
                ],
            )
        return failed


def _counter_fields(counters: PushCounters) -> dict[Any, Any]:
    return {name: getattr(counters, name) for name in _COUNTERS}
