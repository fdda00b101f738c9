"""imroute-client's acks against real in-process gateways and the push API, on real
sockets and Redis: the gateway takes them, they are paced, and what they cover leaves
the inbox; what they do not is sent again and dropped by msg_id."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import redis.asyncio as aioredis
from imroute_client import ImrouteClient, Message, Recovered

from socket_gateway.app import Gateway
from tests.integration.recovery_helpers import acked
from tests.integration.sdk import API, drain, next_message, pumping, push, registered
from tests.integration.stack import api, gateway, one_group, token
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

BURST = 200


async def inbox_replay(http: httpx.AsyncClient, uid: str) -> Recovered:
    """What a new device of `uid` (no position, no acks of its own) is replayed."""
    async with (
        ImrouteClient(API, token(uid), http=http, auto_ack=False) as device,
        pumping(device) as got,
    ):
        await wait_for(lambda: device.last_recovery is not None, "its recovered frame")
        assert device.last_recovery is not None
        assert len(got) == device.last_recovery.count
        return device.last_recovery


def ack_counts(gw: Gateway) -> tuple[int, int, int]:
    assert gw.acks is not None
    c = gw.acks.counts
    return c.acks, c.acked, c.bad


async def test_a_burst_of_200_is_acked_at_most_once_per_100_ms_and_leaves_the_inbox(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    async with (
        one_group(redis_url, prefix) as (gw, http),
    ):
        async with ImrouteClient(API, token("alice"), http=http) as client:
            await client.connect()
            await registered(redis, prefix, "alice")
            loop = asyncio.get_running_loop()
            async with pumping(client) as got:
                start = loop.time()
                for chunk in range(0, BURST, 20):
                    sent = await asyncio.gather(
                        *(push(http, "alice", n) for n in range(chunk, chunk + 20))
                    )
                    assert all(d == ["alice"] for d in sent)
                await wait_for(lambda: len(got) == BURST, "the burst", 20)
                # The pump asks for one more: the last is done with, and acked, too.
                await wait_for(lambda: client.stats.acked == BURST, "the acks", 10)
                elapsed = loop.time() - start
            assert sorted(m.content for m in got) == list(range(BURST))
            frames = client.stats.acks_sent
            assert frames <= elapsed / 0.1 + 2, (frames, elapsed)  # one per 100 ms at most
            await acked(gw, BURST)
            # The gateway took every frame, none bad, and never closed for one.
            assert ack_counts(gw) == (frames, BURST, 0)
            assert client.stats.connects == 1
        assert await inbox_replay(http, "alice") == Recovered(0, True)


async def test_without_auto_ack_nothing_is_acked_until_the_app_acks(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    async with (
        one_group(redis_url, prefix) as (gw, http),
        ImrouteClient(API, token("bob"), http=http, auto_ack=False) as client,
    ):
        await client.connect()
        await registered(redis, prefix, "bob")
        got: list[Message] = []
        for n in range(3):
            assert await push(http, "bob", n) == ["bob"]
            got.append(await next_message(client))
        await asyncio.sleep(0.5)  # five pacing intervals
        assert client.stats.acks_sent == 0 and ack_counts(gw) == (0, 0, 0)
        assert client.pos is None  # the position follows the acks too
        # At least once: another device of bob's is sent all three from the inbox.
        assert await inbox_replay(http, "bob") == Recovered(3, True)
        await client.ack(got[-1])  # cumulative: all three
        await acked(gw, 3)
        assert ack_counts(gw) == (1, 3, 0) and client.stats.acks_sent == 1
        assert client.pos == got[-1].pos
        assert await inbox_replay(http, "bob") == Recovered(0, True)


async def test_pushes_held_unacked_across_a_move_are_sent_again_dropped_and_acked_once(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    async with (
        gateway(redis_url, prefix, "gw1", "g1", heartbeat_s=0.2, drain_window_s=0.2) as gw1,
        gateway(redis_url, prefix, "gw2", "g1", heartbeat_s=0.2, drain_window_s=0.2) as gw2,
        api(redis_url, prefix) as http,
        ImrouteClient(API, token("carol"), http=http, auto_ack=False) as client,
    ):
        await client.connect()
        first = client.gateway_id
        gws = {"gw1": gw1, "gw2": gw2}
        other = {"gw1": "gw2", "gw2": "gw1"}[str(first)]
        await registered(redis, prefix, "carol")
        for n in range(2):
            assert await push(http, "carol", n) == ["carol"]
        held = [await next_message(client), await next_message(client)]
        await drain(http, str(first))
        async with pumping(client) as later:
            await wait_for(lambda: client.gateway_id == other, f"carol on {other}", 10)
            # Nothing was acked, so no position: the new connection is sent the inbox,
            # both again; the client drops them by msg_id and acks neither for the app.
            await wait_for(lambda: client.stats.duplicates == 2, "the copies", 10)
            await asyncio.sleep(0.3)
            assert later == [] and ack_counts(gws[other]) == (0, 0, 0)
            await client.ack(held[1])  # as the app got it, from the ended connection
            await acked(gws[other], 2)  # on the live one: its copy, and m1's
        assert ack_counts(gws[other]) == (1, 2, 0)
        assert [m.content for m in held] == [0, 1] and client.stats.messages == 2
        assert await inbox_replay(http, "carol") == Recovered(0, True)
