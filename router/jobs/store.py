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
import logging
from dataclasses import asdict
from typing import Any

from router.jobs.base import (
    COUNTERS,
    ORPHANED,
    Checkpoint,
    Claim,
    FailedBatch,
    Job,
    JobStatus,
    Lease,
    PushCounters,
    out_of_attempts,
    read_failed,
)
from router.redis.client import LARGE_WRITE_BYTES, REDIS_TIMEOUT_S, RedisClient, own_connection
from router.redis.errors import redis_errors, translate_errors
from router.redis.scripts import Script, ScriptRunner
from shared.clock import Clock
from shared.errors import RegistryRefused, RegistryUnavailable
from shared.keys import KeySchema

__all__ = ["Job", "JobStatus", "RedisJobStore"]

log = logging.getLogger(__name__)

FINISHED_TTL_S = 7 * 24 * 3600

# Each write is one script (its comments say what it takes); the fenced ones start with
# the check of the writer's epoch (`fence_fn.lua`).
_PROGRESS = Script.load(__package__, "fence_fn", "progress")
_FINISH = Script.load(__package__, "fence_fn", "finish")
_RELEASE = Script.load(__package__, "fence_fn", "release")
_CREATE = Script.load(__package__, "create")
_NOW = Script.load(__package__, "redis_now")
_CLAIM = Script.load(__package__, "claim")


RECENT_KEPT = 100  # jobs:recent holds the latest this many
# What a job's status is read from.
_READ = (
    "push_id",
    "mode",
    "status",
    "error",
    "created_at",
    "finished_at",
    "attempts",
    "failed",
    *COUNTERS,
)


class RedisJobStore:
    def __init__(
        self,
        redis: RedisClient,
        keys: KeySchema,
        clock: Clock,
        lease_s: float = 10.0,
        redis_timeout_s: float = REDIS_TIMEOUT_S,
    ):
        """`redis_timeout_s`: how long a command waits for its reply (its client's
        IMROUTE_REDIS_TIMEOUT_S); a job's creation run more than half of it after it was
        sent creates nothing, as its request was (or is about to be) answered 503."""
        self._redis = redis
        self._keys = keys
        self._clock = clock
        self._lease_ms = int(lease_s * 1000)
        self._create_within_ms = int(redis_timeout_s * 500)
        scripts = (_PROGRESS, _FINISH, _RELEASE, _CREATE, _CLAIM, _NOW)
        self._scripts = ScriptRunner(redis, scripts)

    def _job_keys(self, push_id: str) -> list[str]:
        return [self._keys.job(push_id), self._keys.jobs_running()]

    @translate_errors
    async def create(self, push_id: str, mode: str, spec: bytes | None = None) -> Lease:
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
        # A creation Redis runs late (paused, or a partition that held the write) must not
        # run a broadcast minutes after its request was answered 503: it carries a
        # deadline on Redis's own clock, read first on the job's node.
        pairs = [v for kv in fields_.items() for v in kv]
        keys = [*self._job_keys(push_id), self._keys.jobs_recent()]
        by = int(await self._scripts.run(_NOW, keys[:1])) + self._create_within_ms
        args = [self._clock.now_ms() + self._lease_ms, push_id, fields_["created_at"]]
        args += [RECENT_KEPT, by, *pairs]
        if spec is None or len(spec) <= LARGE_WRITE_BYTES:
            created = await self._scripts.run(_CREATE, keys, *args)
        else:  # a multicast's `to` list of megabytes
            async with own_connection(self._redis) as one:
                created = await ScriptRunner(one, (_CREATE,)).run(_CREATE, keys, *args)
        if created != 1:
            raise RegistryUnavailable(
                f"Redis ran the creation of job {push_id} more than "
                f"{self._create_within_ms / 1000:g} s after it was sent (paused, or "
                "overloaded): not created"
            )
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
        return bool(await self._scripts.run(_PROGRESS, self._job_keys(lease.push_id), *args) == 1)

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
        return bool(await self._scripts.run(_FINISH, self._job_keys(lease.push_id), *args) == 1)

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
        return bool(await self._scripts.run(_RELEASE, self._job_keys(lease.push_id), *args) == 1)

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
        if not lapsed:
            return claims, failed
        # A claim reads the job's spec back: a multicast's `to` list may be megabytes.
        async with own_connection(self._redis) as one:
            scripts = ScriptRunner(one, (_CLAIM,))
            for push_id in lapsed:
                try:
                    with redis_errors():
                        got = await scripts.run(
                            _CLAIM,
                            self._job_keys(push_id),
                            now,
                            now + self._lease_ms,
                            max_attempts,
                            push_id,
                            FINISHED_TTL_S,
                            ORPHANED,
                            out_of_attempts(max_attempts),
                        )
                except RegistryRefused as exc:
                    # This job's record cannot be claimed (not a hash, a script error):
                    # every pass would stop at it, so it is passed over, and said.
                    log.warning("lapsed job %s cannot be claimed: %s", push_id, exc)
                    continue
                except RegistryUnavailable as exc:
                    if not claims:
                        raise
                    # The jobs claimed so far are this process's now: run them, or
                    # their leases lapse and each retake costs them an attempt.
                    log.warning(
                        "claimed %d of %d lapsed jobs, then: %s; the rest at the next pass",
                        len(claims),
                        len(lapsed),
                        exc,
                    )
                    break
                if not got:
                    continue
                if got[0] == 0:
                    failed += 1
                    continue
                epoch, spec, checkpoint, mode, attempts = got
                at = Checkpoint.from_json(checkpoint) if checkpoint else None
                claims.append(Claim(Lease(push_id, int(epoch)), mode, spec, at, int(attempts)))
        return claims, failed

    @translate_errors
    async def get(self, push_id: str) -> Job | None:
        # Named fields, not HGETALL: a running multicast's spec holds its `to` list.
        key = self._keys.job(push_id)
        values = await self._redis.hmget(key, _READ)
        raw: dict[str, Any] = {k: v for k, v in zip(_READ, values, strict=True) if v is not None}
        if not raw and not await self._redis.exists(key):
            return None  # a record without our fields is not one: reading it raises below
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
