"""A script whose reply timed out is not sent again by the cluster client (real cluster).

redis-py's cluster client retries a command that failed with a TimeoutError or a
ConnectionError (`retry`, here router.redis.client.CLUSTER_RETRIES): for a script that
ran but whose reply was lost, that runs it again (a P2P message appended twice to a
user's log). The script here INCRs its key, then keeps its node busy past the client's
socket timeout, so its reply always times out after the write."""

from __future__ import annotations

import asyncio
import socket

import pytest
import redis.exceptions
from redis.asyncio.cluster import PRIMARY, ClusterNode, RedisCluster

from router.redis.client import create_redis
from router.redis.scripts import Script, ScriptRunner
from tests.integration.redis_cluster import LocalCluster
from tests.integration.redis_process import redis_process

pytestmark = pytest.mark.integration

TIMEOUT_S = 0.5
BUSY_MS = 800  # past TIMEOUT_S, and over before the client's retries are spent

# INCR, then a busy wait of ARGV[1] ms (Lua cannot sleep; TIME is allowed after a write).
SLOW_INCR = Script(
    "local n = redis.call('INCR', KEYS[1])\n"
    "local t = redis.call('TIME')\n"
    "local until_us = t[1] * 1000000 + t[2] + tonumber(ARGV[1]) * 1000\n"
    "repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= until_us\n"
    "return n\n"
)


def _value(cluster: LocalCluster, key: str) -> str | None:
    """`key` read by a plain client of its primary (5 s timeout: waits out a script)."""
    with cluster.client(cluster.primary_of(key)) as node:
        value = node.get(key)
    return None if value is None else str(value)


async def test_a_script_whose_reply_timed_out_ran_once(
    redis_cluster: LocalCluster, prefix: str
) -> None:
    client = create_redis(redis_cluster.url, timeout_s=TIMEOUT_S)
    runner = ScriptRunner(client, [SLOW_INCR])
    key = f"{prefix}count"
    try:
        await runner.run(SLOW_INCR, [key], 0)  # loaded and quick: nothing to wait out
        assert _value(redis_cluster, key) == "1"
        with pytest.raises(redis.exceptions.TimeoutError):
            await runner.run(SLOW_INCR, [key], BUSY_MS)
        await asyncio.sleep(3 * BUSY_MS / 1000)  # any run sent again has ended
        assert _value(redis_cluster, key) == "2"  # ran once, not again after the timeout
    finally:
        await asyncio.sleep(BUSY_MS / 1000)
        await client.delete(key)
        await client.aclose()


@pytest.mark.parametrize("redirected", [False, True], ids=["answered", "moved"])
async def test_a_pipelined_script_whose_reply_timed_out_ran_once(
    redis_cluster: LocalCluster, prefix: str, redirected: bool
) -> None:
    """In a pipeline over two primaries (ScriptRunner.many): the quick one's reply is
    kept, the slow one's timeout raised, and each ran once. `moved`: the slow call is
    answered MOVED first, and redis-py sends it alone (client.execute_command): its
    reply timing out must not run it again either."""
    client = create_redis(redis_cluster.url, timeout_s=TIMEOUT_S)
    assert isinstance(client, RedisCluster)
    runner = ScriptRunner(client, [SLOW_INCR])
    keys = [f"{prefix}k{i}" for i in range(64)]
    slow = keys[0]
    quick = next(k for k in keys if redis_cluster.primary_of(k) != redis_cluster.primary_of(slow))
    try:
        assert await runner.many([SLOW_INCR.args([slow], 0), SLOW_INCR.args([quick], 0)]) == [1, 1]
        if redirected:  # a stale slot map (as after a failover or a resharding)
            owner = client.get_node_from_key(slow)
            wrong = next(n for n in client.get_primaries() if n.name != owner.name)
            client.nodes_manager.slots_cache[client.keyslot(slow)] = [wrong]
        with pytest.raises(redis.exceptions.TimeoutError):
            await runner.many([SLOW_INCR.args([slow], BUSY_MS), SLOW_INCR.args([quick], 0)])
        await asyncio.sleep(3 * BUSY_MS / 1000)
        assert [_value(redis_cluster, slow), _value(redis_cluster, quick)] == ["2", "2"]
    finally:
        await asyncio.sleep(BUSY_MS / 1000)
        await client.delete(slow, quick)
        await client.aclose()


async def test_a_script_that_could_not_connect_is_sent_again(
    redis_cluster: LocalCluster, prefix: str
) -> None:
    """A failure to connect comes before the write: the call is sent again, after the
    topology is read again, and runs once."""
    client = create_redis(redis_cluster.url, timeout_s=TIMEOUT_S)
    assert isinstance(client, RedisCluster)
    runner = ScriptRunner(client, [SLOW_INCR])
    key = f"{prefix}count"
    try:
        assert await runner.run(SLOW_INCR, [key], 0) == 1
        # The slot's primary at an address where nothing listens (a node gone).
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            gone = probe.getsockname()[1]
        kwargs = {
            k: v for k, v in client.get_connection_kwargs().items() if k not in ("host", "port")
        }
        client.nodes_manager.slots_cache[client.keyslot(key)] = [
            ClusterNode("127.0.0.1", gone, PRIMARY, **kwargs)
        ]
        await asyncio.sleep(1.1)  # past redis-py's topology_refresh_min_interval
        assert await runner.run(SLOW_INCR, [key], 0) == 2
        assert _value(redis_cluster, key) == "2"
    finally:
        await client.delete(key)
        await client.aclose()


async def test_a_standalone_redis_client_never_sends_a_timed_out_script_again(
    prefix: str,
) -> None:
    """The plain client (a pool's connections) does not retry at all: the same script
    whose reply timed out ran once, alone and through the auto-pipeline's pipelines."""
    with redis_process() as server:
        client = create_redis(server.url, timeout_s=TIMEOUT_S)
        patient = create_redis(server.url, timeout_s=10)  # its reads wait out the scripts
        runner = ScriptRunner(client, [SLOW_INCR])
        key = f"{prefix}count"
        try:
            await runner.run(SLOW_INCR, [key], 0)
            for calls, total in ((1, "2"), (3, "5")):  # one call, and a pipeline of three
                with pytest.raises(redis.exceptions.TimeoutError):
                    await runner.many([SLOW_INCR.args([key], BUSY_MS)] * calls)
                # Read behind every run sent so far (a resend goes before the error):
                # each ran once.
                assert await patient.get(key) == total
        finally:
            await client.aclose()
            await patient.aclose()
