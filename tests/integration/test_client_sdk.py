"""imroute-client against the real stack: in-process gateways and push API on real
sockets and Redis, and a real gateway process killed and restarted."""

from __future__ import annotations

import asyncio
import re
import signal

import pytest
import redis.asyncio as aioredis
from imroute_client import ImrouteClient, Unauthorized

from router.gateway_rpc.client import GrpcGatewayClients
from router.processes.ports import free_port
from router.testing import deliver_one
from shared.batches import to_batch
from shared.clock import SystemClock
from shared.models import Message as ServerMessage
from tests.integration.procs import BIN, gateway_env, read_until, running
from tests.integration.sdk import API, drain, next_message, pumping, push, registered
from tests.integration.stack import api, gateway, one_group, token
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


async def test_a_p2p_push_arrives_and_a_duplicate_msg_id_is_dropped(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    rpc = GrpcGatewayClients()
    async with (
        one_group(redis_url, prefix) as (gw, http),
        ImrouteClient(API, token("alice"), http=http) as client,
    ):
        await client.connect()
        assert client.gateway_id == "gw1" and client.pos is None
        await registered(redis, prefix, "alice")
        # Its replay over (connect() returns at the 101): a push that raced the replay
        # would be written by it, as recovered.
        await wait_for(
            lambda: [c.held for c in gw.conns] == [None], "alice's replay done", every=0.01
        )
        assert await push(http, "alice", {"text": "hi"}) == ["alice"]
        msg = await next_message(client)
        assert (msg.sender, msg.content, msg.msg_type, msg.recovered) == (
            "admin", {"text": "hi"}, 0, False,
        )  # fmt: skip
        assert msg.pos is not None  # the SDK keeps it, once processed, for a resume

        # The same message under two batch ids (which the gateway's own dedup cannot
        # catch) is written twice; the client hands it over once.
        dup = ServerMessage("dup-1", "p-dup", 0, "admin", b'"twice"', SystemClock().now_ms())
        after = ServerMessage("after-1", "p-after", 0, "admin", b'"after"', SystemClock().now_ms())
        address = f"127.0.0.1:{gw.grpc_port}"
        for batch_id, message in (("b1", dup), ("b2", dup), ("b3", after)):
            reply = await deliver_one(
                rpc, "gw1", address, to_batch(message, ["alice"], batch_id), 2.0
            )
            assert list(reply.delivered) == ["alice"]
        assert [(await next_message(client)).msg_id for _ in range(2)] == ["dup-1", "after-1"]
        assert client.stats.duplicates == 1 and client.stats.messages == 3
    await rpc.close()


async def test_a_drained_gateway_s_client_moves_through_dispatch_and_keeps_receiving(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    async with (
        gateway(redis_url, prefix, "gw1", "g1", heartbeat_s=0.2, drain_window_s=0.3) as gw1,
        gateway(redis_url, prefix, "gw2", "g1", heartbeat_s=0.2) as gw2,
        api(redis_url, prefix) as http,
        ImrouteClient(API, token("bob"), http=http) as client,
    ):
        await client.connect()
        first = client.gateway_id
        other = {"gw1": "gw2", "gw2": "gw1"}[str(first)]
        drained = {"gw1": gw1, "gw2": gw2}[str(first)]
        await registered(redis, prefix, "bob")
        async with pumping(client) as got:
            assert await push(http, "bob", 1) == ["bob"]
            await wait_for(lambda: len(got) == 1, "the first push")
            await drain(http, str(first))
            await drained.drained.wait()
            await wait_for(lambda: client.gateway_id == other, f"bob on {other}")
            assert (client.stats.told, client.stats.moves, client.stats.dispatches) == (1, 1, 2)
            for _ in range(250):  # the new route is written (coalesced) after the connect
                if await push(http, "bob", 2) == ["bob"]:
                    break
                await asyncio.sleep(0.02)
            await wait_for(lambda: len(got) == 2, "the push after the move")
        assert [m.content for m in got] == [1, 2]


async def test_a_refused_token_stops_the_client_with_unauthorized(
    redis_url: str, prefix: str
) -> None:
    other_secret = "another-secret-0123456789abcdef-01234"
    async with (
        # The gateway checks tokens with another secret than dispatch: dispatch accepts
        # the token, the gateway answers the handshake with 401.
        gateway(redis_url, prefix, "gw1", "g1", secret=other_secret) as gw,
        api(redis_url, prefix) as http,
    ):
        async with ImrouteClient(API, token("carol"), http=http) as client:
            with pytest.raises(Unauthorized, match="HTTP 401: invalid token"):
                await next_message(client)
            with pytest.raises(Unauthorized):  # for good: no retry
                await next_message(client)
            assert client.stats.connects == 0 and client.stats.dispatches == 1
            assert gw._ws is not None and gw._ws.refusals.counts["unauthorized"] == 1
        async with ImrouteClient(API, "not-a-token", http=http) as client:
            with pytest.raises(Unauthorized, match="401"):
                await client.connect()


async def test_the_only_gateway_killed_and_restarted_is_retried_in_place(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    ws_port, grpc_port = free_port(), free_port()
    argv = [str(BIN / "imroute"), "gateway", "--id", "gwr", "--group", "g1",
            "--ws-port", str(ws_port), "--grpc-port", str(grpc_port),
            "--heartbeat", "0.5"]  # fmt: skip
    env = gateway_env(redis_url, prefix)
    async with (
        api(redis_url, prefix) as http,
        ImrouteClient(
            API, token("dave"), http=http, retries_same=1000, backoff_max_s=0.2
        ) as client,
    ):
        with running(argv, env) as proc:
            assert re.search(r"ws=\S+", (await asyncio.to_thread(read_until, proc, "ready"))[-1])
            await client.connect()
            await registered(redis, prefix, "dave")
            async with pumping(client) as got:
                assert await push(http, "dave", "before") == ["dave"]
                await wait_for(lambda: len(got) == 1, "the push before the crash")
                proc.send_signal(signal.SIGKILL)  # no close frame, no goodbye
                proc.wait(5)
                await wait_for(lambda: client.stats.same_retries >= 2, "retries in place")
                assert client.gateway_id is None
                with running(argv, env) as again:
                    await asyncio.to_thread(read_until, again, "ready")
                    await wait_for(lambda: client.gateway_id == "gwr", "dave back", 10)
                    for _ in range(250):
                        if await push(http, "dave", "after") == ["dave"]:
                            break
                        await asyncio.sleep(0.02)
                    await wait_for(lambda: len(got) == 2, "the push after the restart")
        assert [m.content for m in got] == ["before", "after"]
        # Retry-same: dispatch was asked once, at the start.
        assert client.stats.dispatches == 1 and client.stats.connects == 2


async def test_a_user_at_the_per_user_cap_waits_instead_of_hammering_the_fleet(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    async with (
        gateway(redis_url, prefix, "gw1", "g1", max_connections_per_user=1) as gw,
        api(redis_url, prefix, max_connections_per_user=1) as http,
        ImrouteClient(API, token("alice"), http=http) as first,
    ):
        await first.connect()
        await registered(redis, prefix, "alice")
        async with ImrouteClient(API, token("alice"), http=http) as second, pumping(second):
            await wait_for(lambda: second.stats.user_cap >= 1, "the 4429 for the cap")
            await asyncio.sleep(1.0)
            # It waits (5 s at least) instead of reconnecting at once, again and again.
            assert second.stats.user_cap == 1 and second.stats.connects == 1
            assert second.stats.refused == 0  # its handshake was not refused: the cap is after
            assert len(gw.conns) == 1
