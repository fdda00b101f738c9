"""The offline inbox and the new input checks: real gateway, API, Redis and WebSocket
clients."""

from __future__ import annotations

import asyncio

import pytest

from shared.errors import ConfigError
from shared.settings import Settings
from socket_gateway.faults import FailCalls
from tests.integration.recovery_helpers import ack, acked, gone, open_ws, pushes, reconnect, replay
from tests.integration.stack import (
    AUTH,
    amy_behind_faults,
    api,
    contents,
    gateway,
    nothing_more,
    one_group,
    p2p,
    push_status,
)

pytestmark = pytest.mark.integration


async def test_a_push_to_an_offline_user_is_queued_and_delivered_on_connect(
    redis_url: str, prefix: str
) -> None:
    async with one_group(redis_url, prefix) as (gw, http):
        body = await p2p(http, ["olive", "otto"], {"text": "while you were out"})
        assert body["offline"] == ["olive", "otto"] and body["queued"] == ["olive", "otto"]
        assert body["delivered"] == [] and body["failed"] == []
        ws = await open_ws(gw, "olive")
        got, end = await replay(ws)
        assert contents(got) == [{"text": "while you were out"}]
        assert got[0]["msg_id"] == body["msg_id"] and got[0]["push_id"] == body["push_id"]
        assert got[0]["recovered"] is True and end == {
            "type": "recovered",
            "count": 1,
            "complete": True,
        }
        await ws.close()
        await gone(gw, "olive")
        # Written to a connection but never acked: still in the inbox, sent again.
        ws = await open_ws(gw, "olive")
        got, _ = await replay(ws)
        assert contents(got) == [{"text": "while you were out"}]
        await ack(ws, got[0])
        await acked(gw, 1)
        assert await reconnect(gw, ws, "olive") == []  # acked: out of the inbox


async def test_store_false_is_not_kept_and_an_expired_ttl_is_never_delivered(
    redis_url: str, prefix: str
) -> None:
    """An expired message is never sent, and its receipt reads expired though the user
    acked what came after it (the replay marks it): never delivered, never acked."""
    async with one_group(redis_url, prefix) as (gw, http):
        body = await p2p(http, ["tia"], "typing...", store=False)
        assert body["offline"] == ["tia"] and body["queued"] == []
        short = await p2p(http, ["tia"], "short-lived", ttl_s=1)
        assert short["queued"] == ["tia"]
        await p2p(http, ["tia"], "lasting")
        await asyncio.sleep(1.2)
        ws = await open_ws(gw, "tia")
        got, end = await replay(ws)
        assert contents(got) == ["lasting"] and end["count"] == 1
        await ack(ws, got[0])
        await acked(gw, 1)
        s = await push_status(http, short["push_id"])
        assert (s["delivered"], s["acked"], s["queued"], s["expired"]) == (0, 0, 0, 1), s
        listed = await http.get(
            f"/v1/pushes/{short['push_id']}/recipients?state=acked", headers=AUTH
        )
        assert listed.json()["uids"] == []
        # store:false to a live client: delivered, at most once, with a position.
        await p2p(http, ["tia"], "typing...", store=False)
        (live,) = await pushes(ws, 1)
        assert live["content"] == "typing..." and live["pos"]
        await ws.close()


async def test_the_inbox_bound_drops_the_oldest(redis_url: str, prefix: str) -> None:
    async with (
        gateway(redis_url, prefix, "gw1", "g1") as gw,
        api(redis_url, prefix, inbox_max=3) as http,
    ):
        for n in range(5):
            assert (await p2p(http, ["ivy"], n))["queued"] == ["ivy"]
        scrape = (await http.get("/metrics")).text
        assert "imroute_inbox_dropped_total 2.0" in scrape, scrape
        ws = await open_ws(gw, "ivy")
        got, end = await replay(ws)
        assert contents(got) == [2, 3, 4] and end["count"] == 3
        await ws.close()


async def test_two_devices_each_resume_from_their_own_position(redis_url: str, prefix: str) -> None:
    async with one_group(redis_url, prefix) as (gw, http):
        phone, laptop = await open_ws(gw, "duo"), await open_ws(gw, "duo")
        await replay(phone)
        await replay(laptop)
        for n in range(2):
            await p2p(http, ["duo"], n)
        phone_pos = (await pushes(phone, 2))[-1]["pos"]
        await pushes(laptop, 2)
        await phone.close()
        for n in range(2, 5):
            assert (await p2p(http, ["duo"], n))["delivered"] == ["duo"]
        laptop_pos = (await pushes(laptop, 3))[-1]["pos"]
        await laptop.close()
        await gone(gw, "duo")
        for n in range(5, 7):
            await p2p(http, ["duo"], n)
        phone = await open_ws(gw, "duo", phone_pos)
        got, end = await replay(phone)
        assert contents(got) == [2, 3, 4, 5, 6] and end["complete"] is True
        laptop = await open_ws(gw, "duo", laptop_pos)
        got, end = await replay(laptop)
        # 5 and 6 left the inbox with the phone's replay; the laptop's log still has them.
        assert contents(got) == [5, 6] and end["complete"] is True
        await phone.close()
        await laptop.close()


async def test_store_must_be_a_boolean(redis_url: str, prefix: str) -> None:
    async with api(redis_url, prefix) as http:
        for path, body in [
            ("/v1/push", {"to": ["a"], "content": 1, "store": "yes"}),
            ("/v1/push", {"to": ["a"], "content": 1, "store": 1}),
            ("/v1/multicast", {"to": ["a"], "content": 1, "store": None}),
            ("/v1/broadcast", {"content": 1, "store": "false"}),
        ]:
            resp = await http.post(path, json=body, headers=AUTH)
            assert resp.status_code == 422, resp.text
            assert "body.store" in [d["field"] for d in resp.json()["detail"]], resp.json()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("IMROUTE_RECOVERY_WINDOW_S", "0"),
        ("IMROUTE_RECOVERY_WINDOW_S", "100000"),
        ("IMROUTE_INBOX_TTL_S", "-1"),
        ("IMROUTE_INBOX_MAX", "0"),
        ("IMROUTE_RECOVERY_USER_MAX", "many"),
        ("IMROUTE_RECOVERY_TOPIC_MAX", "5"),
    ],
)
def test_the_recovery_settings_are_range_checked_by_name(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.load({name: value})
    assert name in str(info.value)


async def test_a_push_that_failed_for_a_live_client_comes_first_when_the_next_one_lands(
    redis_url: str, prefix: str
) -> None:
    """A failed push is queued; the next push to the same user shows the gateway a hole
    in the user's sequence, which it fills from the log first: both arrive, in order."""
    faults = FailCalls()
    async with (
        gateway(redis_url, prefix, "gw1", "g1", interceptors=[faults]) as gw,
        api(redis_url, prefix, deliver_retries=0) as http,
    ):
        ws = await open_ws(gw, "gail")
        await replay(ws)
        await p2p(http, ["gail"], "before")
        assert contents(await pushes(ws, 1)) == ["before"]
        faults.arm(1, after=False)
        body = await p2p(http, ["gail"], "failed")
        assert body["failed"] == ["gail"] and body["queued"] == ["gail"]
        assert (await p2p(http, ["gail"], "next"))["delivered"] == ["gail"]
        got = await pushes(ws, 2)
        assert contents(got) == ["failed", "next"]
        # The gap fill wrote it: its receipt says delivered (it was queued).
        for _ in range(100):
            resp = await http.get(f"/v1/pushes/{body['push_id']}", headers=AUTH)
            if resp.json()["delivered"] == 1:
                break
            await asyncio.sleep(0.05)
        assert (resp.json()["delivered"], resp.json()["queued"]) == (1, 0)
        assert gw.resumer is not None and gw.resumer.gap_filled == 1
        await asyncio.sleep(1.5)  # the background retry finds it written: not again
        assert await nothing_more(ws)
        await ack(ws, got[1])  # both, cumulatively
        await acked(gw, 2)
        assert await reconnect(gw, ws, "gail") == []  # and, acked, they left the inbox


async def test_a_failed_push_whose_ttl_passed_before_its_hole_was_filled_reads_expired(
    redis_url: str, prefix: str
) -> None:
    """The gap fill passes over it (never sent late) and marks its receipt expired, so
    the ack of the next one does not make it acked."""
    async with amy_behind_faults(redis_url, prefix, retries=0) as (faults, gw, http, ws):
        faults.arm(2, after=False)  # the push, and its background retry 1 s later
        body = await p2p(http, ["amy"], "short-lived", ttl_s=1)
        assert body["failed"] == ["amy"] and body["queued"] == ["amy"]
        await asyncio.sleep(1.5)
        assert faults.remaining == 0
        assert (await p2p(http, ["amy"], "next"))["delivered"] == ["amy"]
        [got] = await pushes(ws, 1)
        assert contents([got]) == ["next"]
        await ack(ws, got)
        await acked(gw, 1)
        for _ in range(100):
            resp = await http.get(f"/v1/pushes/{body['push_id']}", headers=AUTH)
            if resp.json()["expired"] == 1:
                break
            await asyncio.sleep(0.05)
        s = resp.json()
        assert (s["delivered"], s["acked"], s["queued"], s["expired"]) == (0, 0, 0, 1), s
