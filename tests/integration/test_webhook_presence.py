"""user.offline and user.online: real gateways, a real push service (its offline sweeper
and webhook sender), real WebSocket clients, real Redis, and a real HTTP receiver that
checks every request's signature.

A quick reconnect must give no event; the check waits for a later user's user.offline
instead of sleeping: entries are swept in due order, so by the time the later one
arrives an earlier one would have too.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import connect

from shared.keys import KeySchema
from socket_gateway.app import Gateway
from tests.integration.procs import BIN, Proc, gateway_env, read_until, running, ws_url_of
from tests.integration.redis_process import redis_process
from tests.integration.stack import api, client, gateway, ready, token
from tests.integration.webhook_receiver import WebhookReceiver
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

HOOK_SECRET = "whsec-test-0123456789"


def hooks(rx: WebhookReceiver, grace_s: float) -> dict[str, Any]:
    return {
        "webhook_url": rx.url,
        "webhook_secret": HOOK_SECRET,
        "webhook_offline_grace_s": grace_s,
        "webhook_backoff_max_s": 0.2,
    }


def offline(rx: WebhookReceiver, uid: str) -> list[dict[str, Any]]:
    return [e for e in rx.of_type("user.offline") if e["uid"] == uid]


def online(rx: WebhookReceiver, uid: str) -> list[dict[str, Any]]:
    return [e for e in rx.of_type("user.online") if e["uid"] == uid]


def sent_once(rx: WebhookReceiver, uid: str, epoch: int) -> None:
    """`uid` got one user.offline, of `epoch`, and the receiver refused nothing and saw
    no event twice."""
    assert [e["epoch"] for e in offline(rx, uid)] == [epoch]
    assert not rx.rejected and not rx.duplicates()


@asynccontextmanager
async def presence(
    redis_url: str, prefix: str, grace_s: float, gateways: int = 2
) -> AsyncIterator[tuple[WebhookReceiver, list[Gateway]]]:
    """A webhook receiver, and gateways gw1, gw2, ... of group g1 and a push service that
    send it presence events `grace_s` after a user's last close."""
    async with WebhookReceiver(HOOK_SECRET) as rx, AsyncExitStack() as stack:
        wh = hooks(rx, grace_s)
        gws = [
            await stack.enter_async_context(gateway(redis_url, prefix, f"gw{n}", "g1", **wh))
            for n in range(1, gateways + 1)
        ]
        await stack.enter_async_context(api(redis_url, prefix, **wh))
        yield rx, gws


async def epoch_of(redis: aioredis.Redis, prefix: str, uid: str) -> int:
    return int(await redis.hget(KeySchema(prefix).presence_prefix() + uid, "e"))


async def test_a_user_who_stays_away_gets_exactly_one_offline_with_its_epoch(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    async with presence(redis_url, prefix, grace_s=0.5, gateways=1) as (rx, [gw]):
        async with client(gw, "alice"), client(gw, "alice"):  # two devices
            epoch = await epoch_of(redis, prefix, "alice")
        await rx.wait_for(lambda: bool(offline(rx, "alice")), "alice's user.offline")
        async with client(gw, "bob"):
            pass
        await rx.wait_for(lambda: bool(offline(rx, "bob")), "bob's user.offline")
    (event,) = offline(rx, "alice")
    assert event == {
        "event_id": f"user.offline:{epoch}:alice",
        "type": "user.offline",
        "ts": event["ts"],
        "uid": "alice",
        "epoch": epoch,
    }
    assert isinstance(event["ts"], int) and event["ts"] > 1_600_000_000_000  # unix ms
    assert not rx.of_type("user.online") and not rx.rejected and not rx.duplicates()


async def test_a_reconnect_within_the_grace_to_this_or_another_gateway_gives_none(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    async with presence(redis_url, prefix, grace_s=1.5) as (rx, [gw1, gw2]):
        async with client(gw1, "alice"), client(gw1, "bob"):
            pass
        async with client(gw1, "alice"), client(gw2, "bob"):  # back within the grace
            epoch = await epoch_of(redis, prefix, "alice")
            async with client(gw1, "carol"):
                pass  # carol stays away: due after alice's and bob's entries
            await rx.wait_for(lambda: bool(offline(rx, "carol")), "carol's user.offline")
            assert not offline(rx, "alice") and not offline(rx, "bob"), rx.events
        # Now alice stays away: her offline carries the reconnection's epoch.
        await rx.wait_for(lambda: bool(offline(rx, "alice")), "alice's user.offline")
    sent_once(rx, "alice", epoch)
    assert not rx.of_type("user.online")


async def test_online_after_offline_carries_a_higher_epoch(redis_url: str, prefix: str) -> None:
    async with presence(redis_url, prefix, grace_s=0.3) as (rx, [gw1, gw2]):
        async with client(gw1, "dave"):
            pass
        await rx.wait_for(lambda: len(offline(rx, "dave")) == 1, "dave's user.offline")
        async with client(gw2, "dave"):
            await rx.wait_for(lambda: len(online(rx, "dave")) == 1, "dave's user.online")
        await rx.wait_for(lambda: len(offline(rx, "dave")) == 2, "dave's 2nd user.offline")
    kinds = [(e["type"], e["epoch"]) for e in rx.events]
    first, back, second = kinds
    assert first[0] == "user.offline" and back[0] == "user.online" and second[0] == "user.offline"
    assert back[1] > first[1]
    assert second[1] == back[1]
    assert rx.events[1]["event_id"] == f"user.online:{back[1]}:dave"
    assert not rx.rejected and not rx.duplicates()


def gateway_proc(
    redis_url: str, prefix: str, rx: WebhookReceiver
) -> tuple[list[str], dict[str, str]]:
    env = gateway_env(
        redis_url,
        prefix,
        IMROUTE_WEBHOOK_URL=rx.url,
        IMROUTE_WEBHOOK_SECRET=HOOK_SECRET,
        IMROUTE_WEBHOOK_OFFLINE_GRACE_S="0.5",
    )
    argv = [str(BIN / "imroute"), "gateway", "--id", "gwc", "--group", "g1",
            "--ws-port", "0", "--grpc-port", "0", "--route-ttl", "1",
            "--heartbeat", "0.2"]  # fmt: skip
    return argv, env


async def connect_then_crash(proc: Proc, redis: aioredis.Redis, prefix: str, uid: str) -> int:
    """Connect `uid` to the gateway process, SIGKILL it (no unregister); `uid`'s epoch."""
    async with connect(f"{await ws_url_of(proc)}?token={token(uid)}") as ws:
        await ready(ws)
        epoch = await epoch_of(redis, prefix, uid)
        proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait, 5)
    return epoch


async def test_the_users_of_a_crashed_gateway_that_stays_gone_get_user_offline(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    async with WebhookReceiver(HOOK_SECRET) as rx:
        argv, env = gateway_proc(redis_url, prefix, rx)
        async with api(redis_url, prefix, **hooks(rx, grace_s=0.5)):
            with running(argv, env) as proc:
                epoch = await connect_then_crash(proc, redis, prefix, "crashy")
            # Out of the fleet for two sweeps' looks (1 s apart), then past its route's
            # deadline: then sent, once.
            await rx.wait_for(lambda: bool(offline(rx, "crashy")), "crashy's user.offline")
    sent_once(rx, "crashy", epoch)


async def test_a_crashed_gateway_that_restarts_schedules_its_last_runs_users(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    async with WebhookReceiver(HOOK_SECRET) as rx:
        argv, env = gateway_proc(redis_url, prefix, rx)
        with running(argv, env) as proc:
            epoch = await connect_then_crash(proc, redis, prefix, "phoenix")
        with running(argv, env) as again:
            await asyncio.to_thread(read_until, again, "ready")  # it adopted its last run's users
            gws = await redis.smembers(KeySchema(prefix).presence_gateways())
            assert "gwc" not in gws  # nothing left for a sweeper to adopt
            async with api(redis_url, prefix, **hooks(rx, grace_s=0.5)):
                await rx.wait_for(lambda: bool(offline(rx, "phoenix")), "phoenix's offline")
    sent_once(rx, "phoenix", epoch)


async def test_a_gateway_lists_its_users_again_after_redis_restarted_empty(
    prefix: str,
) -> None:
    """Redis restarted empty under a gateway took its set of users, so a crash after that
    left them without user.offline: the route refresh lists them again."""
    keys = KeySchema(prefix)
    with redis_process() as server:
        fresh = aioredis.Redis.from_url(server.url, decode_responses=True)
        try:
            async with WebhookReceiver(HOOK_SECRET) as rx:
                argv, env = gateway_proc(server.url, prefix, rx)
                with running(argv, env) as proc:
                    async with connect(f"{await ws_url_of(proc)}?token={token('lazarus')}") as ws:
                        await ready(ws)
                        server.kill()
                        server.start()  # the same address, nothing in it

                        async def listed() -> bool:
                            users = await fresh.smembers(keys.gateway_users("gwc"))
                            gateways = await fresh.smembers(keys.presence_gateways())
                            return "lazarus" in users and "gwc" in gateways

                        await wait_for(listed, "lazarus listed in gwc's set again", 10.0)
                        proc.send_signal(signal.SIGKILL)
                        await asyncio.to_thread(proc.wait, 5)
                async with api(server.url, prefix, **hooks(rx, grace_s=0.5)):
                    await rx.wait_for(lambda: bool(offline(rx, "lazarus")), "lazarus's offline")
        finally:
            await fresh.aclose()
    assert len(offline(rx, "lazarus")) == 1
    assert not rx.rejected and not rx.duplicates()


async def test_a_user_who_flaps_gets_one_offline_for_the_last_epoch(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    # The first close's entry falls due while erin is away again: only its epoch, no
    # longer hers, keeps it from being sent before the second close's grace is over.
    async with presence(redis_url, prefix, grace_s=1.0) as (rx, [gw1, gw2]):
        async with client(gw1, "erin"):
            first = await epoch_of(redis, prefix, "erin")
        async with client(gw2, "erin"):
            last = await epoch_of(redis, prefix, "erin")
        await rx.wait_for(lambda: bool(offline(rx, "erin")), "erin's user.offline")
        async with client(gw1, "frank"):
            pass
        await rx.wait_for(lambda: bool(offline(rx, "frank")), "frank's user.offline")
    assert last > first
    sent_once(rx, "erin", last)


async def test_a_user_whose_schedule_failed_gets_user_offline_after_a_clean_stop(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    """An unregister whose schedule Redis did not take leaves its user in the gateway's
    set. A clean stop deleted that set, so the user never got user.offline; it now
    schedules what the set still holds, as a crashed gateway's restart would."""
    keys = KeySchema(prefix)
    async with WebhookReceiver(HOOK_SECRET) as rx:
        wh = hooks(rx, grace_s=1.5)
        async with api(redis_url, prefix, **wh):
            async with gateway(redis_url, prefix, "gwr", "g1", **wh) as gw:
                async with client(gw, "alice"):
                    epoch = await epoch_of(redis, prefix, "alice")
                member = f"{epoch}:alice"
                await wait_for(lambda: redis.zscore(keys.offline_due(), member), "alice scheduled")
                # As Redis leaves it when the unregister's schedule fails mid-way.
                assert await redis.zrem(keys.offline_due(), member) == 1
                await redis.sadd(keys.gateway_users("gwr"), "alice")
            # gwr stopped cleanly
            await rx.wait_for(lambda: bool(offline(rx, "alice")), "alice's user.offline")
    sent_once(rx, "alice", epoch)
    assert not await redis.exists(keys.gateway_users("gwr"))
    assert "gwr" not in await redis.smembers(keys.presence_gateways())


async def test_a_last_close_on_one_gateway_while_connected_on_another_leaves_its_set(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    """A gateway's set holds the users connected there: alice's last close on gw1 while
    she is on gw2 takes her off gw1's set at once (she stayed in it for as long as gw1
    ran: a set that only grew), with no event while she is on gw2."""
    keys = KeySchema(prefix)
    async with presence(redis_url, prefix, grace_s=0.3) as (rx, [gw1, gw2]):
        async with client(gw2, "alice"):
            async with client(gw1, "alice"):
                assert await redis.sismember(keys.gateway_users("gw1"), "alice")
            await wait_for(lambda: routes_left(redis, prefix, "alice", 1), "gw1's unregister")
            await wait_for(
                lambda: not_in_set(redis, prefix, "gw1", "alice"), "alice off gw1's set", 2
            )
            assert await redis.smembers(keys.gateway_users("gw2")) == {"alice"}
            async with client(gw1, "carol"):
                pass  # carol stays away: due after alice's close on gw1
            await rx.wait_for(lambda: bool(offline(rx, "carol")), "carol's user.offline")
            assert not offline(rx, "alice"), rx.events
            assert not await redis.exists(keys.gateway_users("gw1"))  # nothing left in it
    assert not rx.of_type("user.online") and not rx.rejected and not rx.duplicates()


async def routes_left(redis: aioredis.Redis, prefix: str, uid: str, n: int) -> bool:
    return int(await redis.hlen(KeySchema(prefix).route(uid))) == n


async def not_in_set(redis: aioredis.Redis, prefix: str, gid: str, uid: str) -> bool:
    """`uid` is not in gateway `gid`'s set of users."""
    return not await redis.sismember(KeySchema(prefix).gateway_users(gid), uid)


async def not_holding(redis: aioredis.Redis, prefix: str, gid: str) -> bool:
    """Gateway `gid` holds no set of users (a sweeper adopted it, or it had none)."""
    return not await redis.sismember(KeySchema(prefix).presence_gateways(), gid)


@pytest.mark.parametrize("first", ["gw1", "gw2"])
async def test_closes_on_two_gateways_in_either_order_give_one_offline_and_empty_sets(
    redis_url: str, prefix: str, redis: aioredis.Redis, first: str
) -> None:
    keys = KeySchema(prefix)
    async with presence(redis_url, prefix, grace_s=0.3) as (rx, gws):
        one, other = (gws[0], gws[1]) if first == "gw1" else (gws[1], gws[0])
        async with client(other, "alice"):
            async with client(one, "alice"):
                epoch = await epoch_of(redis, prefix, "alice")  # her newest connection's
            await wait_for(
                lambda: not_in_set(redis, prefix, first, "alice"), f"alice off {first}'s set", 2
            )
        await rx.wait_for(lambda: bool(offline(rx, "alice")), "alice's user.offline")
        for gid in ("gw1", "gw2"):
            assert not await redis.sismember(keys.gateway_users(gid), "alice"), gid
    sent_once(rx, "alice", epoch)
    assert not rx.of_type("user.online")


async def test_a_gateway_stopping_after_its_users_left_elsewhere_for_good_sends_nothing(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    """alice leaves gw1 while on gw2, then gw2 too, and gets her user.offline. Her state
    expires 30 days later; gw1, still up all along, then stops cleanly: a stale member
    of its set was scheduled with a new epoch, a second user.offline."""
    keys = KeySchema(prefix)
    async with WebhookReceiver(HOOK_SECRET) as rx:
        wh = hooks(rx, grace_s=0.3)
        async with (
            api(redis_url, prefix, **wh),
            gateway(redis_url, prefix, "gw2", "g1", **wh) as gw2,
        ):
            async with gateway(redis_url, prefix, "gw1", "g1", **wh) as gw1:
                async with client(gw2, "alice"):
                    async with client(gw1, "alice"):
                        epoch = await epoch_of(redis, prefix, "alice")
                    await wait_for(
                        lambda: routes_left(redis, prefix, "alice", 1), "gw1's unregister"
                    )
                await rx.wait_for(lambda: bool(offline(rx, "alice")), "alice's user.offline")
                await redis.delete(keys.presence_prefix() + "alice")  # as after 30 days
            # gw1 stopped cleanly: what its set held is scheduled
            async with client(gw2, "bob"):
                pass  # due after anything gw1's stop scheduled
            await rx.wait_for(lambda: bool(offline(rx, "bob")), "bob's user.offline")
    sent_once(rx, "alice", epoch)


async def test_a_crashed_gateway_swept_while_its_user_is_elsewhere_gives_no_offline_till_she_leaves(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    async with presence(redis_url, prefix, grace_s=0.5, gateways=1) as (rx, [gw1]):
        argv, env = gateway_proc(redis_url, prefix, rx)
        async with client(gw1, "alice"):
            with running(argv, env) as proc:
                epoch = await connect_then_crash(proc, redis, prefix, "alice")
            await wait_for(
                lambda: not_holding(redis, prefix, "gwc"),
                "gwc found gone and its users scheduled",
                10,
            )
            async with client(gw1, "carol"):
                pass  # carol stays away: due after what gwc's sweep scheduled
            await rx.wait_for(lambda: bool(offline(rx, "carol")), "carol's user.offline")
            assert not offline(rx, "alice"), rx.events  # still on gw1
        await rx.wait_for(lambda: bool(offline(rx, "alice")), "alice's user.offline")
    sent_once(rx, "alice", epoch)
    assert not rx.of_type("user.online")
