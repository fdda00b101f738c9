"""`examples/minimal_client.py`, the client written from docs/clients/protocol.md alone,
run as a subprocess against a real gateway and push service (served over HTTP, so the
client asks `GET /v1/dispatch` itself): a push arrives and is acked; its connection is
cut while the gateway refuses new ones (503, `Retry-After`); a push sent meanwhile
arrives after the reconnect, replayed from its `since`; nothing arrives twice. And a
refused token stops it, at dispatch and at the gateway's handshake."""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.auth import issue_token
from shared.clock import SystemClock
from tests.integration.http_raw import uvicorn_on
from tests.integration.procs import Proc, base_env, read_until, running
from tests.integration.stack import api_app, gateway, p2p, push_status, token
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "minimal_client.py"


async def printed(client: Proc, marker: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The frames the client printed up to the line holding `marker` (read in a thread:
    the test's loop serves the gateway and the API meanwhile). Its other lines, on
    stderr, are not JSON objects."""
    lines = await asyncio.to_thread(read_until, client, marker, timeout)
    return [json.loads(line) for line in lines if line.startswith("{")]


def more_lines(client: Proc, wait: float) -> list[str]:
    """What the client prints from now until it has said nothing for `wait` seconds."""
    assert client.lines is not None
    seen: list[str] = []
    try:
        while (line := client.lines.get(timeout=wait)) is not None:
            seen.append(line)
    except queue.Empty:
        pass
    return seen


async def acked(http: httpx.AsyncClient, push_id: str) -> bool:
    status = await push_status(http, push_id)
    return bool(status["acked"] == 1)


async def test_the_minimal_client_acks_and_resumes_from_its_position(
    redis_url: str, prefix: str
) -> None:
    async with (
        gateway(redis_url, prefix, "gw1", "g1") as gw,
        api_app(redis_url, prefix) as (http, app),
        uvicorn_on(app, "h11") as port,
    ):
        api_url = f"http://127.0.0.1:{port}"
        # A token signed with another secret: refused by dispatch, and by the gateway.
        forged = issue_token("not-the-secret-" + "x" * 32, "alice", 60, SystemClock())
        for where in (api_url, f"ws://127.0.0.1:{gw.ws_port}/ws"):
            refused = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, str(EXAMPLE), where, forged],
                env=base_env(),
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            assert refused.returncode == 2, (where, refused.stdout, refused.stderr)
            assert "disconnected: 401" in refused.stderr, refused.stderr

        argv = [sys.executable, str(EXAMPLE), api_url]
        with running(argv, base_env(IMROUTE_TOKEN=token("alice"))) as client:
            # Connected without `since`: an empty inbox, so a replay of nothing.
            assert await printed(client, '"type":"recovered"') == [
                {"type": "recovered", "count": 0, "complete": True}
            ]

            one = await p2p(http, ["alice"], {"text": "one"}, wait_ack_ms=5000)
            assert one["delivered"] == ["alice"] and one["acked"] == ["alice"], one
            [live] = await printed(client, '"one"')
            assert live["type"] == "push" and "recovered" not in live, live
            assert (live["msg_id"], live["push_id"]) == (one["msg_id"], one["push_id"])
            status = await push_status(http, one["push_id"])
            assert status["delivered"] == 1 and status["acked"] == 1, status

            # Its gateway stops taking clients (503, Retry-After: 2) and cuts it.
            endpoint = gw.ws_endpoint
            assert endpoint is not None
            endpoint.accepting = False
            [conn] = [c for c in gw.conns if c.uid == "alice"]
            conn.sink.abort()
            await asyncio.to_thread(read_until, client, "disconnected: 503", 10)
            two = await p2p(http, ["alice"], {"text": "two"})
            assert two["delivered"] == [], two
            endpoint.accepting = True

            # Back with `since`: only what it missed, replayed, then the live pushes.
            replay = await printed(client, '"type":"recovered"', 15)
            assert [(f["type"], f.get("content"), f.get("recovered")) for f in replay] == [
                ("push", {"text": "two"}, True),
                ("recovered", None, None),
            ], replay
            assert replay[0]["msg_id"] == two["msg_id"] and replay[0]["pos"] != live["pos"]
            assert replay[-1] == {"type": "recovered", "count": 1, "complete": True}
            # It came from the position (the inbox alone would have given the same here).
            assert gw.resumer is not None
            assert (gw.resumer.stats.resumes, gw.resumer.stats.complete) == (1, 1)
            await wait_for(lambda: acked(http, two["push_id"]), "the replayed push acked")

            three = await p2p(http, ["alice"], {"text": "three"}, wait_ack_ms=5000)
            assert three["acked"] == ["alice"], three
            [after] = await printed(client, '"three"')
            assert "recovered" not in after
            rest = await asyncio.to_thread(more_lines, client, 0.5)
            assert not [line for line in rest if line.startswith("{")], rest
