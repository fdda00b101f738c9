"""message.unacked: a real gateway and push API, real Redis, real WebSocket clients and
a real HTTP receiver that checks every request's signature."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.processes.ports import free_port
from tests.integration.procs import push_services
from tests.integration.recovery_helpers import ack, acked, multicast_acked, open_ws, pushes, replay
from tests.integration.stack import AUTH, api, gateway, p2p
from tests.integration.webhook_receiver import WebhookReceiver
from tests.integration.webhooks import HOOK_SECRET, env_for

pytestmark = pytest.mark.integration


def hooks(rx: WebhookReceiver, **kw: Any) -> dict[str, Any]:
    return {
        "webhook_url": rx.url,
        "webhook_secret": HOOK_SECRET,
        "webhook_unacked_s": 1,
        "webhook_backoff_max_s": 0.2,
        **kw,
    }


def unacked_of(rx: WebhookReceiver, push_id: str) -> list[dict[str, Any]]:
    return [e for e in rx.of_type("message.unacked") if e["push_id"] == push_id]


async def test_offline_and_silent_recipients_get_one_message_unacked(
    redis_url: str, prefix: str
) -> None:
    async with WebhookReceiver(HOOK_SECRET) as rx:
        async with (
            gateway(redis_url, prefix, "gw1", "g1", **hooks(rx)) as gw,
            api(redis_url, prefix, **hooks(rx)) as http,
        ):
            loud, quiet = await open_ws(gw, "loud"), await open_ws(gw, "quiet")
            for ws in (loud, quiet):
                await replay(ws)
            content = {"text": "é" * 300}  # a preview is cut at 256 bytes, whole characters
            body = await p2p(http, ["loud", "quiet", "away"], content, msg_type=7)
            (frame,) = await pushes(loud, 1)
            await ack(loud, frame)
            await acked(gw, 1)
            typing = await p2p(http, ["away"], "typing...", store=False)
            await rx.wait_for(lambda: bool(unacked_of(rx, body["push_id"])), "message.unacked")
            await asyncio.sleep(2.5)  # later sweeps add nothing: it fires once
            (event,) = unacked_of(rx, body["push_id"])
            assert event["uids"] == ["away", "quiet"]
            assert (event["msg_id"], event["msg_type"], event["from"]) == (
                body["msg_id"], 7, "admin",
            )  # fmt: skip
            preview = event["preview"]
            text = json.dumps(content, ensure_ascii=False, separators=(",", ":"))
            assert 250 <= len(preview.encode()) <= 256 and text.startswith(preview)
            assert (
                isinstance(event["ts"], int) and event["event_id"] == f"unacked:{body['push_id']}:0"
            )
            assert unacked_of(rx, typing["push_id"]) == []  # store:false: not stored, no event
            assert rx.duplicates() == []
            for ws in (loud, quiet):
                await ws.close()


async def test_a_large_multicast_names_whoever_did_not_ack_without_a_preview(
    redis_url: str, prefix: str
) -> None:
    """Past IMROUTE_RECEIPTS_MAX_RECIPIENTS the receipt keeps counts only; the event
    still names every recipient who did not ack, 1000 at most per event."""
    async with WebhookReceiver(HOOK_SECRET) as rx:
        wh = hooks(rx, webhook_preview=False)
        async with (
            gateway(redis_url, prefix, "gw1", "g1", **wh) as gw,
            api(redis_url, prefix, receipts_max_recipients=100, **wh) as http,
        ):
            to = [f"m{n:04d}" for n in range(2500)]
            push_id, ws = await multicast_acked(gw, http, to, "big")
            await rx.wait_for(lambda: len(unacked_of(rx, push_id)) == 3, "3 events")
            events = sorted(unacked_of(rx, push_id), key=lambda e: e["event_id"])
            assert [len(e["uids"]) for e in events] == [1000, 1000, 499]
            named = [u for e in events for u in e["uids"]]
            assert named == to[1:] and all(e["preview"] is None for e in events)
            await ws.close()


async def test_two_push_services_each_send_each_message_unacked_once(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """Pushes through two real push-service processes: both sweep, each push's event is
    claimed by one of them, and the receiver gets each once."""
    async with WebhookReceiver(HOOK_SECRET) as rx:
        ports = [free_port(), free_port()]
        env = env_for(redis_url, prefix, tmp_path, rx.url, IMROUTE_WEBHOOK_UNACKED_S="1")
        async with push_services(env, ports):
            push_ids = []
            async with httpx.AsyncClient() as http:
                for n in range(40):
                    port = ports[n % 2]
                    resp = await http.post(
                        f"http://127.0.0.1:{port}/v1/push",
                        json={"to": [f"off{n}"], "content": n},
                        headers=AUTH,
                    )
                    assert resp.status_code == 200, resp.text
                    push_ids.append(resp.json()["push_id"])
            await rx.wait_for(
                lambda: len(rx.of_type("message.unacked")) >= 40, "40 message.unacked"
            )
            await asyncio.sleep(2.0)  # more sweeps: nothing more
        events = rx.of_type("message.unacked")
        assert sorted(e["push_id"] for e in events) == sorted(push_ids)
        assert all(e["uids"] == [f"off{push_ids.index(e['push_id'])}"] for e in events)
        assert not rx.duplicates() and not rx.rejected
