"""Building the Redis client from a URL (standalone or Cluster), with its timeouts."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from importlib import metadata
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import AbstractBackoff

from router.redis.errors import REDIS_PY, not_sent
from shared.backoff import backoff_s
from shared.urls import unreadable_url

__all__ = [
    "LARGE_WRITE_BYTES",
    "GentleRedisCluster",
    "RedisClient",
    "connect_redis",
    "connection_identity",
    "create_redis",
    "execute_once",
    "own_connection",
    "ping",
    "unanswered",
]

# Both clients offer the commands and pipelines the registry uses.
RedisClient = aioredis.Redis | RedisCluster

POOL_SIZE = 64
POOL_WAIT_S = 5.0
REDIS_TIMEOUT_S = 5.0  # IMROUTE_REDIS_TIMEOUT_S
CLUSTER_RETRIES = 2


class _Backoff(AbstractBackoff):
    """redis-py's retries (the cluster client's) wait as ours do (`shared.backoff`, equal
    jitter), from 50 ms up to 0.5 s. Stateless: one serves every client."""

    def compute(self, failures: int) -> float:
        return backoff_s(failures, 0.05, 0.5)


_BACKOFF = _Backoff()


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

# Newer redis-py: initialize() can ask a failed node last.
_DEFERS_FAILED = "last_failed_node_name" in inspect.signature(RedisCluster.initialize).parameters

# Set while a task sends a command that must not run twice (`execute_once`).
_SENT_ONCE: ContextVar[bool] = ContextVar("imroute_sent_once", default=False)


class GentleRedisCluster(RedisCluster):
    """redis-py's asyncio cluster client, whose own resets spare other tasks' commands.

    redis-py calls its `aclose()` after a ClusterDownError or SlotNotCoveredError, on
    every fifth MOVED, and before a pipeline retries a connection error, to re-read the
    topology. That disconnects every connection of every node at once, those that other
    tasks are writing to or reading from included: they fail with an AttributeError
    (`'NoneType' object has no attribute 'writelines'`) or a ConnectionError, and each
    such failure resets the client again. In a master failover of a few seconds that
    made about half a minute of errors. Here a reset from redis-py's own code
    marks every connection to be reconnected by the next command that takes it (redis-py's
    lazy reconnect, race-free: no task closes a connection another one holds) and re-reads
    the topology before the next command. `aclose()` called by its owner closes as before.
    Its MULTI is refused (see `pipeline`). A Lua script call (EVAL, EVALSHA, FCALL) is
    sent as `execute_once` sends it: never again once it may have run.
    """

    # redis-py reads `retry` at the start of every command and pipeline for how many
    # times to send it again after a TimeoutError or ConnectionError (its own
    # `supported_errors` are not consulted): inside `execute_once` (this task only),
    # a copy with none, the same backoff (which also paces topology refreshes).
    @property
    def retry(self) -> Any:
        return self._no_retry if _SENT_ONCE.get() else self._retry

    @retry.setter
    def retry(self, value: Any) -> None:
        self._retry = value
        self._no_retry = copy.copy(value)
        self._no_retry.update_retries(0)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            if _SENT_ONCE.get() or not _runs_script(args):
                return await super().execute_command(*args, **kwargs)
            # Also a call that redis-py's pipeline sends alone after MOVED or ASK.
            return await execute_once(self, *args, **kwargs)
        except asyncio.CancelledError:
            self.stalled()
            raise

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> Any:
        if transaction:
            # redis-py's asyncio cluster MULTI queues each command through asyncio.run()
            # in a thread of its own (its sync API), blocking this loop meanwhile; once
            # the topology must be re-read, that other loop takes the client's lock:
            # "Lock ... is bound to a different event loop".
            raise NotImplementedError(
                "no MULTI on Redis Cluster: run a Lua script over keys of one hash slot"
            )
        if shard_hint:
            return super().pipeline(transaction, shard_hint)  # refused, as redis-py does
        return _GentlePipeline(self, transaction)  # type: ignore[abstract]

    async def initialize(
        self,
        additional_startup_nodes_info: list[tuple[str, int]] | None = None,
        last_failed_node_name: str | None = None,
    ) -> GentleRedisCluster:
        # redis-py moves a node whose command failed to the end of its startup nodes but
        # then asks them in random order, deferring only the caller's own failed node:
        # a SIGSTOPped primary asked first holds the re-read, and every command waiting
        # for it, for a whole timeout. Ask the most recently failed node last.
        nodes = self.nodes_manager.startup_nodes
        if last_failed_node_name is None and nodes and _DEFERS_FAILED:
            last_failed_node_name = next(reversed(nodes))
        before = dict(self.nodes_manager.nodes_cache)
        if _DEFERS_FAILED:
            await super().initialize(additional_startup_nodes_info, last_failed_node_name)
        else:
            await super().initialize(additional_startup_nodes_info)
        # A node gone from the topology (a primary that failed over while it hangs):
        # commands still waiting on it would wait out their timeout. Cut them off, so
        # that redis-py sends them again, to the new primary, at once.
        for name, node in before.items():
            if name not in self.nodes_manager.nodes_cache:
                for connection in list(node._connections):
                    with contextlib.suppress(redis.exceptions.RedisError, OSError):
                        await connection.disconnect(nowait=True)
        return self

    def stalled(self) -> None:
        """A command was given up (its caller's deadline, a cancelled task): its node
        may hang (SIGSTOPped, partitioned) without redis-py ever seeing a timeout, which
        is what makes it re-read the topology. Re-read it before the next command, so a
        replica promoted meanwhile is found at once."""
        self._initialize = True

    async def aclose(self) -> None:
        caller = sys._getframe(1).f_code.co_filename  # the coroutine awaiting this one
        if not caller.startswith(REDIS_PY) or not self._mark_for_reconnect():
            await super().aclose()
            return
        self._initialize = True

    def _mark_for_reconnect(self) -> bool:
        """Mark every connection of every node; False on a redis-py whose cluster nodes
        have no lazy reconnect (older ones), whose reset then stays its own."""
        manager = self.nodes_manager
        nodes = list({**manager.startup_nodes, **manager.nodes_cache}.values())
        if not all(hasattr(node, "disconnect_if_needed") for node in nodes):
            return False
        for node in nodes:
            for connection in node._connections:
                connection.mark_for_reconnect()  # type: ignore[no-untyped-call]
        return True


class _GentlePipeline(ClusterPipeline):
    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
        try:
            return await super().execute(raise_on_error, allow_redirections)
        except asyncio.CancelledError:
            client = self.cluster_client
            if isinstance(client, GentleRedisCluster):
                client.stalled()
            raise


@contextlib.contextmanager
def _sent_once() -> Iterator[None]:
    token = _SENT_ONCE.set(True)
    try:
        yield
    finally:
        _SENT_ONCE.reset(token)


async def execute_once(client: RedisClient, *args: Any, **kwargs: Any) -> Any:
    """`client.execute_command(*args)` for a command that must not run twice (a script
    that appends): never sent again once it may have reached Redis.

    redis-py's cluster client sends a command again after a TimeoutError or a
    ConnectionError (its `retry`, CLUSTER_RETRIES here), also one whose reply was lost
    after it ran. Here it is sent again only after an error that proves it was not
    sent: CLUSTERDOWN (refused before running), a slot no node covers, or a failure to
    connect before writing it; up to as many times as the client's `retry` says. Its
    MOVED and ASK are followed as before. A reply lost after the send raises
    (RegistryUnavailable once mapped): whether it ran is unknown.
    """
    if not isinstance(client, GentleRedisCluster):
        return await client.execute_command(*args, **kwargs)
    retries = client.retry.get_retries()
    failures = 0
    while True:
        try:
            with _sent_once():
                return await client.execute_command(*args, **kwargs)
        except (
            redis.exceptions.ConnectionError,
            redis.exceptions.TimeoutError,
            redis.exceptions.ClusterDownError,
            redis.exceptions.SlotNotCoveredError,
        ) as exc:
            failures += 1
            if failures > retries or not not_sent(exc):
                raise
            await asyncio.sleep(_BACKOFF.compute(failures))


# Not idempotent in general: a script that appends must not run twice.
_SCRIPT_COMMANDS = frozenset({"EVAL", "EVALSHA", "FCALL"})


def _runs_script(args: tuple[Any, ...]) -> bool:
    return bool(args) and isinstance(args[0], str) and args[0].upper() in _SCRIPT_COMMANDS


def connection_identity() -> dict[str, Any]:
    """What every pooled connection tells Redis (CLIENT SETINFO), resolved once.

    Left to itself, redis-py 7+ looks its own version up in the installed packages'
    metadata for every new connection (`importlib.metadata.version`, a walk of
    sys.path): 48 ms of a push service's loop on a busy machine when its pool grew under
    load (docs/benchmarks/index.md)."""
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
            return GentleRedisCluster.from_url(
                "redis://" + url.removeprefix("redis+cluster://"),
                decode_responses=True,
                # redis-py retries a cluster command on a connection error or timeout 10
                # times by default (only the count is used; each retry re-reads the
                # topology): with a hung node, over 50 s before an answer. Two retries
                # still ride out a failover's new topology. MOVED and ASK are followed
                # apart from these retries.
                # Scripts are never sent again once they may have run (`execute_once`).
                retry=Retry(_BACKOFF, CLUSTER_RETRIES),
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
        raise unreadable_url("IMROUTE_REDIS_URL", url, exc) from None


@asynccontextmanager
async def connect_redis(url: str, timeout_s: float = REDIS_TIMEOUT_S) -> AsyncIterator[RedisClient]:
    """A Redis client that is closed on exit."""
    client = create_redis(url, timeout_s)
    try:
        yield client
    finally:
        await client.aclose()


# A write of more bytes than this goes on a connection of its own (`own_connection`).
LARGE_WRITE_BYTES = 1 << 20


@asynccontextmanager
async def own_connection(client: RedisClient) -> AsyncIterator[RedisClient]:
    """A client over one connection of `client`'s pool, disconnected when the block ends
    (the pool opens a new one when it next needs one): for a write or read of megabytes.

    Measured: after the pooled connection that carried a multicast's 11-MB `to` list
    went back to the pool, the route look-ups that took it next (redis-py pools are
    last in, first out) ran slower: a 1M-uid multicast took a median 2.27 s instead of
    1.84 s, and as before on a connection of its own
    (docs/benchmarks/history/2026-12-05-resumable-multicast.md). The next command to
    take it from the pool reconnects first. A cluster client is given as it is:
    redis-py's has no single-connection mode."""
    if isinstance(client, RedisCluster):
        yield client
        return
    one = aioredis.Redis(connection_pool=client.connection_pool, single_connection_client=True)
    try:
        yield one
    finally:
        used = one.connection  # None if the block sent nothing
        try:
            if used is not None:
                # Not waited for: nothing here for a timeout or a second cancel to
                # interrupt, so the release below always runs (no pool slot lost).
                await used.disconnect(nowait=True)
        finally:
            await one.aclose()


async def ping(client: RedisClient) -> bool:
    """True when Redis answers, and serves every slot when it is a cluster (readiness)."""
    return await unanswered(client, serving=True) is None


async def unanswered(client: RedisClient, *, serving: bool = False) -> str | None:
    """Why Redis does not answer a PING (redis-py's words: a refused connection, a
    wrong password, a cluster none of whose nodes answers, which is a
    RedisClusterException, not a RedisError), or, with `serving`, why a Redis Cluster
    does not serve all its slots; None when it does. The words name no password."""
    try:
        result: Any = await client.ping()
        if result and serving and isinstance(client, RedisCluster):
            # One node answers a PING; whether the cluster serves every slot is its
            # cluster_state (`fail` from a master's loss until its replica took over).
            info: Any = await client.cluster_info()
            state = info.get("cluster_state") if isinstance(info, dict) else None
            if state != "ok":
                return f"the Redis Cluster's state is {state} (CLUSTER INFO)"
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        return str(exc) or type(exc).__name__
    return None if result else "it answered the PING with nothing"
