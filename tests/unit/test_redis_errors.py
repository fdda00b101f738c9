"""Which redis-py errors become RegistryUnavailable (a 503 at the API), Cluster's included."""

from __future__ import annotations

import pytest
import redis.exceptions
from redis.asyncio.connection import Connection

from router.redis.client import ping
from router.redis.errors import redis_errors
from shared.errors import BusUnavailable, RegistryRefused, RegistryUnavailable


async def test_cluster_exceptions_outside_redis_error_are_mapped() -> None:
    # SlotNotCoveredError and "cannot be connected" are RedisClusterException, which
    # is not a RedisError: a failover's window, not a bug of ours.
    with pytest.raises(RegistryUnavailable, match="redis cluster unavailable"):
        with redis_errors():
            raise redis.exceptions.SlotNotCoveredError("slot 7 is not covered")
    with pytest.raises(BusUnavailable):
        with redis_errors(BusUnavailable):
            raise redis.exceptions.RedisClusterException("Redis Cluster cannot be connected")


async def test_redirects_past_redis_py_s_limit_are_said_as_such() -> None:
    """The Redis Cluster trial: a slot moving half-way logged "redis error: TTL
    exhausted.", which reads as a key's TTL; it is redis-py's count of redirects."""
    with pytest.raises(RegistryUnavailable, match="kept redirecting the command") as info:
        with redis_errors():
            raise redis.exceptions.ClusterError("TTL exhausted.")
    assert "TTL" not in str(info.value)


async def test_a_connection_closed_under_a_command_is_mapped() -> None:
    # What another task's disconnect leaves behind: redis-py writing to no writer. Before
    # redis-py 8.2 that is an AttributeError inside redis-py; from 8.2 a ConnectionError.
    connection = Connection()
    with pytest.raises(
        RegistryUnavailable, match=r"connection closed under the command|redis did not answer"
    ):
        with redis_errors():
            await connection._send_packed_command([b"PING\r\n"])


async def test_our_own_attribute_errors_stay_bugs() -> None:
    with pytest.raises(AttributeError):
        with redis_errors():
            None.writelines  # type: ignore[attr-defined]  # noqa: B018


def test_not_now_replies_are_transient_and_other_replies_final() -> None:
    from router.redis.errors import is_transient

    for exc in (
        redis.exceptions.ConnectionError("refused"),
        redis.exceptions.TimeoutError("slow"),
        redis.exceptions.BusyLoadingError("LOADING"),
        redis.exceptions.ReadOnlyError("READONLY You can't write against a read only replica."),
        redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"),
        redis.exceptions.MasterDownError("MASTERDOWN Link with MASTER is down"),
        redis.exceptions.TryAgainError("TRYAGAIN Multiple keys request during rehashing"),
        redis.exceptions.MovedError("3999 127.0.0.1:6381"),
        redis.exceptions.AskError("3999 127.0.0.1:6381"),
    ):
        assert is_transient(exc), exc
    for exc in (
        redis.exceptions.ResponseError("ERR wrong number of arguments"),
        redis.exceptions.OutOfMemoryError("OOM command not allowed"),
        redis.exceptions.NoScriptError("NOSCRIPT"),
    ):
        assert not is_transient(exc), exc


# Redis 6 quotes the reply a script's call got in an error of its own.
SCRIPT_ERROR = "ERR Error running script (call to f_1): @user_script:1: "


@pytest.mark.parametrize(
    ("text", "transient"),
    [
        ("BUSY Redis is busy running a script.", True),
        ("NOREPLICAS Not enough good replicas to write.", True),
        (SCRIPT_ERROR + "@user_script: 1: -READONLY You can't write against a replica.", True),
        (SCRIPT_ERROR + "WRONGTYPE Operation against a key holding the wrong kind", False),
        ("ERR unknown command 'BUSYBOX'", False),
    ],
)
def test_a_reply_redis_py_has_no_class_for_is_read_by_its_code(text: str, transient: bool) -> None:
    from router.redis.errors import is_transient

    assert is_transient(redis.exceptions.ResponseError(text)) is transient


async def test_a_final_reply_is_a_refusal_and_silence_or_not_now_is_not() -> None:
    for reply in (
        redis.exceptions.ResponseError("WRONGTYPE Operation against a key"),
        redis.exceptions.OutOfMemoryError("OOM command not allowed"),
    ):
        with pytest.raises(RegistryRefused, match="redis error: "):
            with redis_errors():
                raise reply
    for exc in (
        redis.exceptions.ReadOnlyError("READONLY a replica"),
        redis.exceptions.ConnectionError("refused"),
    ):
        with pytest.raises(RegistryUnavailable) as raised:
            with redis_errors():
                raise exc
        assert type(raised.value) is RegistryUnavailable
    with pytest.raises(BusUnavailable) as bus:  # only the registry's tree says refused
        with redis_errors(BusUnavailable):
            raise redis.exceptions.ResponseError("WRONGTYPE Operation against a key")
    assert type(bus.value) is BusUnavailable


def test_the_redis_streams_bus_retries_a_failover_reply() -> None:
    from router.bus.redis_streams import RedisStreamsTransport

    readonly = redis.exceptions.ReadOnlyError("READONLY You can't write against a replica.")
    assert RedisStreamsTransport.is_retryable(readonly)
    assert not RedisStreamsTransport.is_retryable(redis.exceptions.ResponseError("ERR syntax"))


def test_an_error_reply_read_by_hiredis_raises_as_redis_py_would() -> None:
    """The bulk reads and the auto-pipeline parse replies themselves: an error reply keeps
    redis-py's class for it, so a failover's READONLY stays worth another try."""
    import hiredis

    from router.redis.autopipe import reply_error
    from router.redis.errors import is_transient

    reader = hiredis.Reader()
    reader.feed(
        b"-READONLY You can't write against a read only replica.\r\n"
        b"-NOSCRIPT No matching script. Please use EVAL.\r\n"
        b"-LOADING Redis is loading the dataset in memory\r\n"
        b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"
        b"-MOVED 3999 127.0.0.1:6381\r\n"
    )
    readonly, noscript, loading, wrongtype, moved = (reply_error(reader.gets()) for _ in range(5))
    assert type(readonly) is redis.exceptions.ReadOnlyError and is_transient(readonly)
    assert str(readonly) == "READONLY You can't write against a read only replica."
    assert type(noscript) is redis.exceptions.NoScriptError
    assert type(loading) is redis.exceptions.BusyLoadingError and is_transient(loading)
    assert type(wrongtype) is redis.exceptions.ResponseError and not is_transient(wrongtype)
    assert str(wrongtype).startswith("WRONGTYPE ")
    assert isinstance(moved, redis.exceptions.MovedError) and is_transient(moved)
    assert (moved.slot_id, moved.node_addr) == (3999, ("127.0.0.1", 6381))


@pytest.mark.parametrize(
    "error",
    [
        redis.exceptions.RedisClusterUnreachableError("no node answers"),
        redis.exceptions.ConnectionError("refused"),
    ],
)
async def test_a_redis_that_does_not_answer_pings_false(error: Exception) -> None:
    """Before: a cluster none of whose nodes answered made /healthz a 500, not a 503."""

    class Down:
        async def ping(self) -> bool:
            raise error

    assert await ping(Down()) is False  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("error", "maybe_applied"),
    [
        (redis.exceptions.TimeoutError("Timeout reading from socket"), True),
        (redis.exceptions.ConnectionError("Connection closed by server."), True),
        (TimeoutError(), True),
        (redis.exceptions.ConnectionError("Connection closed by the server before write"), False),
    ],
)
async def test_an_unanswered_command_says_whether_redis_may_have_run_it(
    error: Exception, maybe_applied: bool
) -> None:
    """A reply lost after the write is not "nothing was sent" (the push service's 503)."""
    with pytest.raises(RegistryUnavailable) as caught, redis_errors():
        raise error
    assert caught.value.maybe_applied is maybe_applied
    with pytest.raises(BusUnavailable) as other, redis_errors(BusUnavailable):
        raise error
    assert not hasattr(other.value, "maybe_applied")
