"""The one mapping of redis-py's errors into ours, used wherever Redis is called.

Which error class a caller raises is its contract (the route store and the fleet raise
RegistryUnavailable, the Redis Streams bus BusUnavailable, as every bus does); which
redis-py errors mean "Redis did not answer" and which mean "Redis refused" is decided
here, once.

On Redis Cluster two more kinds mean "the cluster cannot answer now" (a failover, a
topology change): redis-py's RedisClusterException family, which is not a RedisError
(a slot not covered, no node reachable to read the topology from), and an
AttributeError from inside redis-py's connection code, raised when another task closed
the connection a command was using (redis-py's asyncio cluster client resets its
connections on some errors while other tasks' commands are in flight; `router.redis.client`
keeps that to connections no command holds, but a narrow window remains upstream).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

import redis.exceptions

from shared.errors import ImrouteError, RegistryRefused, RegistryUnavailable

__all__ = [
    "REDIS_PY",
    "is_transient",
    "is_unreachable",
    "not_sent",
    "redis_errors",
    "reraise_swallowed_cancel",
    "translate_errors",
]

P = ParamSpec("P")
T = TypeVar("T")

# Where redis-py's own code lives: a frame there is the library's, not ours.
REDIS_PY = os.path.dirname(redis.exceptions.__file__) + os.sep


def is_unreachable(exc: BaseException) -> bool:
    """Redis did not answer (in time): worth another try, unlike an error reply."""
    return isinstance(
        exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError | TimeoutError
    )


# Error replies that say "not now" rather than "never": a replica promoted behind the
# address (READONLY), a cluster mid-failover (CLUSTERDOWN, MASTERDOWN) or mid-resharding
# (TRYAGAIN, and MOVED or ASK that the cluster client's own redirects did not settle).
# LOADING is a ConnectionError to redis-py already.
_TRANSIENT_REPLIES = (
    redis.exceptions.ReadOnlyError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.MovedError,
    redis.exceptions.AskError,
)
# The same by their codes, and those redis-py has no class for: a script running past
# its time (BUSY), too few replicas in reach for min-replicas-to-write (NOREPLICAS).
# Redis 6 answers a script whose call got one of them with a generic error that quotes
# it ("ERR Error running script ...: -READONLY You can't write ..."): found there too.
_NOT_NOW = re.compile(
    r"(?:^|-)(?:READONLY|CLUSTERDOWN|MASTERDOWN|TRYAGAIN|LOADING|MOVED|ASK|BUSY|NOREPLICAS) "
)


def is_transient(exc: BaseException) -> bool:
    """Worth another try: Redis did not answer (in time), or answered "not now"."""
    if is_unreachable(exc) or isinstance(exc, _TRANSIENT_REPLIES):
        return True
    return isinstance(exc, redis.exceptions.ResponseError) and bool(_NOT_NOW.search(str(exc)))


_BEFORE_WRITE = frozenset({"connect_check_health", "check_health"})  # redis-py's


def not_sent(exc: BaseException) -> bool:
    """`exc` proves that the command it failed was not written to Redis."""
    if isinstance(exc, redis.exceptions.ClusterDownError | redis.exceptions.SlotNotCoveredError):
        return True  # CLUSTERDOWN answers before running; an uncovered slot sends nothing
    if type(exc) not in (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return False  # its subclasses (AuthenticationError, MaxConnectionsError, ...)
    if str(exc).startswith("Connection closed by the server before write"):
        return True
    # Raised while (re)connecting or by a health-check PING, which come before the write.
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name in _BEFORE_WRITE and code.co_filename.startswith(REDIS_PY):
            return True
        tb = tb.tb_next
    return False


class _RedisErrors:
    """The mapping as a context manager: stateless, so one instance per target class is
    reused on every call (it runs around every Redis command of the hot P2P path)."""

    __slots__ = ("_refused", "_to")

    def __init__(self, to: type[ImrouteError]) -> None:
        self._to = to
        # An error reply that another try would get again, where the tree says so.
        self._refused = RegistryRefused if to is RegistryUnavailable else to

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            reraise_swallowed_cancel()
            return
        if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
            reraise_swallowed_cancel()
            raise _unanswered(self._to(f"redis did not answer: {exc}"), not not_sent(exc)) from exc
        if isinstance(exc, TimeoutError):  # an asyncio.timeout around the command
            reraise_swallowed_cancel()
            raise _unanswered(self._to("redis did not answer in time"), True) from exc
        if isinstance(exc, redis.exceptions.ResponseError) and not is_transient(exc):
            reraise_swallowed_cancel()
            raise self._refused(f"redis error: {exc}") from exc
        if isinstance(exc, redis.exceptions.ClusterError) and str(exc).startswith("TTL"):
            # redis-py's "TTL exhausted.": no key TTL, its count of MOVED/ASK redirects
            reraise_swallowed_cancel()
            raise self._to(
                "redis cluster kept redirecting the command (MOVED/ASK: a slot moving, or "
                "the cluster's view of its slots changing)"
            ) from exc
        if isinstance(exc, redis.exceptions.RedisError):
            reraise_swallowed_cancel()
            raise self._to(f"redis error: {exc}") from exc
        if isinstance(exc, redis.exceptions.RedisClusterException):
            reraise_swallowed_cancel()
            raise self._to(f"redis cluster unavailable: {exc}") from exc
        if isinstance(exc, AttributeError) and _raised_in_redis_py(exc):
            reraise_swallowed_cancel()
            raise self._to(f"redis connection closed under the command: {exc}") from exc


def _unanswered(err: ImrouteError, maybe_applied: bool) -> ImrouteError:
    """`err`, saying whether Redis may have run what it was sent (its reply lost)."""
    if isinstance(err, RegistryUnavailable):
        err.maybe_applied = maybe_applied
    return err


def _raised_in_redis_py(exc: BaseException) -> bool:
    """The innermost frame of `exc` is redis-py's own code (not ours misusing it)."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename.startswith(REDIS_PY)


_MAPPERS: dict[type[ImrouteError], _RedisErrors] = {}


def redis_errors(to: type[ImrouteError] = RegistryUnavailable) -> AbstractContextManager[None]:
    """Raise redis-py errors from inside as `to`, and a swallowed cancellation as itself."""
    mapper = _MAPPERS.get(to)
    if mapper is None:
        mapper = _MAPPERS[to] = _RedisErrors(to)
    return mapper


def translate_errors(
    fn: Callable[P, Coroutine[Any, Any, T]],
) -> Callable[P, Coroutine[Any, Any, T]]:
    """Decorate a Redis-calling coroutine so redis-py errors surface as RegistryUnavailable."""

    mapper = redis_errors(RegistryUnavailable)

    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        with mapper:
            return await fn(*args, **kwargs)

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
