"""How the registry reads many route hashes in one round trip: two ways, chosen per client.

- `BulkHashReads`: standalone Redis; one RESP buffer out, every reply parsed in one go
  (`router.redis.autopipe`), several times cheaper than redis-py's pipeline.
- `PipelineHashReads`: redis-py's non-transactional pipeline. Redis Cluster needs it,
  because the cluster client splits the keys by node; anything that is not a plain
  `redis.asyncio.Redis` (a cluster client, a test's wrapper) gets this one.

Every reply is decoded as text. A route hash is read whole (`HGETALL`, for P2P, which
needs the connection ids) or as values only (`HVALS`, for group multicast): under RESP3,
redis-py 8's default, hiredis turns an `HGETALL` map into a dict about three times more
slowly than it builds the `HVALS` list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import redis.asyncio as aioredis

from router.redis.autopipe import AutoPipeline, RespBulkReader
from router.redis.client import RedisClient

__all__ = ["BulkHashReads", "HashReads", "PipelineHashReads", "hash_reads_for"]


class HashReads(Protocol):
    async def hgetall(self, keys: Sequence[str]) -> list[Mapping[str, str]]: ...
    async def hvals(self, keys: Sequence[str], prefix: str = "") -> list[list[str]]: ...


class PipelineHashReads:
    """Through redis-py's pipeline: works on every client, Redis Cluster included."""

    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis

    async def hgetall(self, keys: Sequence[str]) -> list[Mapping[str, str]]:
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
        replies: list[Mapping[str, str]] = await pipe.execute()
        return replies

    async def hvals(self, keys: Sequence[str], prefix: str = "") -> list[list[str]]:
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            pipe.hvals(prefix + key)
        replies: list[list[str]] = await pipe.execute()
        return replies


class BulkHashReads:
    """Through one packed request on a pooled connection of a standalone client; one key
    through the auto-pipeline, if any (sharing a round trip with other tasks' commands)."""

    def __init__(self, redis: aioredis.Redis, auto: AutoPipeline | None = None) -> None:
        self.reader = RespBulkReader(redis)
        self._auto = auto

    async def hgetall(self, keys: Sequence[str]) -> list[Mapping[str, str]]:
        if len(keys) == 1 and self._auto is not None:
            replies = [await self._auto.execute("HGETALL", keys[0])]
        else:
            replies = await self.reader.read("HGETALL", keys)
        # RESP3 answers a map (a dict); RESP2 a flat list of field, value, ...
        return [
            r if isinstance(r, dict) else dict(zip(r[::2], r[1::2], strict=True)) for r in replies
        ]

    async def hvals(self, keys: Sequence[str], prefix: str = "") -> list[list[str]]:
        """The values of each hash `prefix` + key."""
        return await self.reader.read("HVALS", keys, prefix)


def hash_reads_for(redis: RedisClient, auto: AutoPipeline | None = None) -> HashReads:
    """The bulk reads for a standalone client, the pipeline for anything else."""
    if isinstance(redis, aioredis.Redis):
        return BulkHashReads(redis, auto)
    return PipelineHashReads(redis)
