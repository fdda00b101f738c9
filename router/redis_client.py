"""Building the Redis client from a URL, and mapping redis-py errors into ours."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, ParamSpec, TypeVar

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from shared.errors import ConfigError, RegistryUnavailable

__all__ = ["RedisClient", "connect_redis", "reraise_swallowed_cancel", "translate_errors"]

# Both clients offer the commands and pipelines the registry uses.
RedisClient = aioredis.Redis | RedisCluster

POOL_SIZE = 64
POOL_WAIT_S = 5.0
REDIS_TIMEOUT_S = 5.0  # IMROUTE_REDIS_TIMEOUT_S
CLUSTER_RETRIES = 2

P = ParamSpec("P")
T = TypeVar("T")


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
            )
        # A blocking pool makes a burst of callers wait for a connection instead of
        # failing at once with "Too many connections" (the default pool's behaviour).
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=POOL_SIZE,
            timeout=POOL_WAIT_S,  # a burst queues for a connection; not tied to the command timeout
            decode_responses=True,
            **timeouts,
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


def translate_errors(
    fn: Callable[P, Coroutine[Any, Any, T]],
) -> Callable[P, Coroutine[Any, Any, T]]:
    """Decorate a Redis-calling coroutine so redis-py errors surface as RegistryUnavailable."""

    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            result = await fn(*args, **kwargs)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            reraise_swallowed_cancel()
            raise RegistryUnavailable(f"redis did not answer: {exc}") from exc
        except redis.exceptions.RedisError as exc:
            reraise_swallowed_cancel()
            raise RegistryUnavailable(f"redis error: {exc}") from exc
        reraise_swallowed_cancel()
        return result

    wrapper.__name__ = getattr(fn, "__name__", "wrapper")
    wrapper.__doc__ = fn.__doc__
    return wrapper


def reraise_swallowed_cancel() -> None:
    """Raise CancelledError if this task was cancelled during the call.

    redis-py's asyncio client can swallow a cancellation that lands while a command
    is in flight (it disconnects and carries on), which would leave a cancelled loop
    running for ever. The task still counts the request, so honour it here.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def ping(client: RedisClient) -> bool:
    """True when Redis answers."""
    try:
        result: Any = await client.ping()
        return bool(result)
    except redis.exceptions.RedisError:
        return False
