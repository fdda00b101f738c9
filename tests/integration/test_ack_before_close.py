"""An ack that arrives in the same read as the client's close frame still counts (found
by the browser client: it acks, then closes, and the gateway used to skip every frame
of a read that held a close). Real gateway, Redis and push service; a raw socket sends
both frames in one write."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import struct
from typing import Any

import pytest

from tests.integration.stack import AUTH, one_group, token
from tests.integration.ws_fuzz_attacks import frame

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]


async def _read_frame(reader: asyncio.StreamReader) -> dict[str, Any]:
    """One unmasked text frame from the server, as JSON."""
    b0, b1 = await reader.readexactly(2)
    n = b1 & 0x7F
    if n == 126:
        (n,) = struct.unpack("!H", await reader.readexactly(2))
    elif n == 127:
        (n,) = struct.unpack("!Q", await reader.readexactly(8))
    payload = await reader.readexactly(n)
    assert b0 & 0x0F == 0x1, (b0, payload)
    body: dict[str, Any] = json.loads(payload)
    return body


async def test_an_ack_in_the_same_read_as_the_close_is_taken(redis_url: str, prefix: str) -> None:
    async with one_group(redis_url, prefix) as (gw, http):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.ws_port)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            (
                f"GET /ws?token={token('amy')} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
        assert (await _read_frame(reader))["type"] == "recovered"
        for _ in range(100):  # its route is written once the replay is done
            resp = await http.post("/v1/push", json={"to": ["amy"], "content": 1}, headers=AUTH)
            if resp.json()["delivered"]:
                break
            await asyncio.sleep(0.02)
        push = resp.json()
        got = await _read_frame(reader)
        while got.get("msg_id") != push["msg_id"]:  # earlier tries, queued: from the inbox
            got = await _read_frame(reader)
        ack = json.dumps({"type": "ack", "pos": got["pos"]}).encode()
        writer.write(frame(0x1, ack) + frame(0x8, struct.pack("!H", 1000)))  # one write
        await writer.drain()
        for _ in range(100):
            status = (await http.get(f"/v1/pushes/{push['push_id']}", headers=AUTH)).json()
            if status["acked"]:
                break
            await asyncio.sleep(0.05)
        assert status["acked"] == 1, status
        writer.close()
