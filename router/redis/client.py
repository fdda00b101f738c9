"""Building the Redis client from a URL (standalone or Cluster), with its timeouts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from shared.errors import ConfigError

__all__ = ["RedisClient", "connect_redis", "connection_identity", "create_redis", "ping"]

# Both clients offer the commands and pipelines the registry uses.
RedisClient = aioredis.Redis | RedisCluster

POOL_SIZE = 64
POOL_WAIT_S = 5.0
REDIS_TIMEOUT_S = 5.0  # IMROUTE_REDIS_TIMEOUT_S
CLUSTER_RETRIES = 2


def _identity() -> dict[str, Any]:
    try:
        from redis.driver_info import DriverInfo
    except ImportError:  # redis-py before 7: the version is read once, at its import
        return {}
    try:
        version = metadata.version("redis")
    except metadata.PackageNotFoundError:
        version = "99.99.99"  # as redis-py says when it cannot tell
    return {"driver_info": DriverInfo(name="redis-py", lib_version=version)}


_IDENTITY = _identity()


def connection_identity() -> dict[str, Any]:
    """What every pooled connection tells Redis (CLIENT SETINFO), resolved once.

    Left to itself, redis-py 7+ looks its own version up in the installed packages'
    metadata for every new connection (`importlib.metadata.version`, a walk of
    sys.path): 48 ms of a push service's loop on a busy machine when its pool grew under
    load (docs/benchmarks.md)."""
    return dict(_IDENTITY)


def create_redis(url: str, timeout_s: float = REDIS_TIMEOUT_S) -> RedisClient:
    """A client for `url`; `redis+cluster://host:port` selects Redis Cluster.

    Every command and connect gives up after `timeout_s`: a Redis that stopped answering
    (paused, partitioned) surfaces as RegistryUnavailable, not as a hang. Waiting for a
    free pooled connection (all 64 busy) takes up to POOL_WAIT_S more.
    """
    timeouts: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    try:
        if url.startswith("redis+cluster://"):
            return RedisCluster.from_url(
                "redis://" + url.removeprefix("redis+cluster://"),
                decode_responses=True,
                # redis-py retries a cluster command on a connection error or timeout 10
                # times by default (only the count is used; each retry re-reads the
                # topology): with a hung node, over 50 s before an answer. Two retries
                # still ride out a failover's new topology. MOVED and ASK are followed
                # apart from these retries.
                retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), CLUSTER_RETRIES),
                **timeouts,
                **connection_identity(),
            )
        # A blocking pool makes a burst of callers wait for a connection instead of
        # failing at once with "Too many connections" (the default pool's behaviour).
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=POOL_SIZE,
            timeout=POOL_WAIT_S,  # a burst queues for a connection; not tied to the command timeout
            decode_responses=True,
            **timeouts,
            **connection_identity(),
            health_check_interval=30,
        )
        return aioredis.Redis.from_pool(pool)
    except ValueError as exc:
        raise ConfigError(f"IMROUTE_REDIS_URL: {exc}") from None


@asynccontextmanager
async def connect_redis(url: str, timeout_s: float = REDIS_TIMEOUT_S) -> AsyncIterator[RedisClient]:
    """A Redis client that is closed on exit."""
    client = create_redis(url, timeout_s)
    try:
        yield client
    finally:
        await client.aclose()


async def ping(client: RedisClient) -> bool:
    """True when Redis answers."""
    try:
        result: Any = await client.ping()
        return bool(result)
    except redis.exceptions.RedisError:
        return False
