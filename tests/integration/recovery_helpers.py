"""Clients that resume: connect with `since`, read the replay, and the pushes after."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect

from router.recovery.base import RecoveryLimits
from router.recovery.store import encode_message
from shared.clock import SystemClock
from shared.models import Message
from socket_gateway.app import Gateway
from tests.integration.stack import Frame, fanout, recv_json, token


async def open_ws(gw: Gateway, uid: str, since: str | None = None) -> ClientConnection:
    url = f"ws://127.0.0.1:{gw.ws_port}/ws?token={token(uid)}"
    if since is not None:
        url += f"&since={since}"
    return await connect(url)


async def replay(ws: ClientConnection, timeout: float = 10.0) -> tuple[list[Frame], Frame]:
    """The pushes a connection is sent before its `recovered` frame, and that frame."""
    pushes: list[Frame] = []
    while True:
        frame = await recv_json(ws, timeout)
        if frame["type"] == "recovered":
            return pushes, frame
        pushes.append(frame)


async def connected(gw: Gateway, uid: str) -> ClientConnection:
    """A client of `gw` as `uid`, once it has read its replay (whatever that held)."""
    ws = await open_ws(gw, uid)
    await replay(ws)
    return ws


async def pushes(ws: ClientConnection, n: int, timeout: float = 10.0) -> list[Frame]:
    return [await recv_json(ws, timeout) for _ in range(n)]


async def ack(ws: ClientConnection, frame: Frame) -> None:
    """Ack a push frame (and, cumulatively, everything the connection had before it)."""
    await ws.send(json.dumps({"type": "ack", "pos": frame["pos"]}))


async def acked(gw: Gateway, n: int, timeout: float = 5.0) -> None:
    """Wait until the gateway has written `n` acked pushes in all (its acks flush)."""
    assert gw.acks is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while gw.acks.counts.acked < n or gw.acks.pending:
        assert loop.time() < deadline, f"{gw.acks.counts.acked} acked, wanted {n}"
        await asyncio.sleep(0.02)


async def gone(gw: Gateway, uid: str) -> None:
    """Wait until the gateway let go of every connection of `uid` (route removed)."""
    for _ in range(500):
        if not any(c.uid == uid for c in gw.conns):
            await asyncio.sleep(0.1)  # the coalesced unregister lands
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{uid} still connected")


async def replayed(gw: Gateway, uid: str) -> list[Frame]:
    """Connect afresh as `uid` (no since), read the replay, close: its pushes."""
    ws = await open_ws(gw, uid)
    got, _ = await replay(ws)
    await ws.close()
    return got


async def reconnect(gw: Gateway, ws: ClientConnection, uid: str) -> list[Frame]:
    """Close, wait until the gateway let go, connect afresh (no since): the replay."""
    await ws.close()
    await gone(gw, uid)
    got = await replayed(gw, uid)
    await gone(gw, uid)
    return got


async def multicast_acked(
    gw: Gateway, http: httpx.AsyncClient, to: list[str], content: Any
) -> tuple[str, ClientConnection]:
    """Multicast `content` to `to`, of whom only the first is online on `gw`, and acks
    it: the push id, and the first's client (still open)."""
    ws = await connected(gw, to[0])
    push_id = await fanout(http, "/v1/multicast", {"to": to, "content": content})
    (frame,) = await pushes(ws, 1)
    await ack(ws, frame)
    await acked(gw, 1)
    return push_id, ws


def dumps(frame: Frame) -> str:
    return json.dumps(frame, sort_keys=True)


# What the version before wrote for an offline user's message, in one script: the log
# entry, then the same message again in the user's inbox (a sorted set by n, its text
# starting "[n,"): the layout that `read_user.lua` reads and `ack.lua` acks as the
# legacy inbox. KEYS: seq, log, inbox. ARGV: the entry's text (n 0), now, and the three
# keys' TTLs as that version set them (seq, log: one window, inbox).
_LEGACY_APPEND = """
local n = redis.call('HINCRBY', KEYS[1], 'n', 1)
if not redis.call('HGET', KEYS[1], 'e') then
  local t = redis.call('TIME')
  local e = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('HSET', KEYS[1], 'e', tostring(e))
end
redis.call('RPUSH', KEYS[2], n .. ' ' .. ARGV[2] .. ' ' .. ARGV[1])
redis.call('ZADD', KEYS[3], n, '[' .. n .. ',' .. string.sub(ARGV[1], 4))
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ARGV[2 + i]) end
return n
"""


async def write_legacy(
    redis: Any, seq: str, log: str, inbox: str, message: Message, expires_ms: int
) -> int:
    """Append `message` to a user's keys (`seq`, `log`, `inbox`: the names the version
    before used for them) in the layout it wrote: logged, and queued in the inbox. Its n."""
    entry = encode_message(message, expires_ms)
    now = SystemClock().now_ms()
    lim = RecoveryLimits()
    ttls = (lim.user_seq_ttl_ms, lim.window_ms, lim.inbox_ttl_ms)
    return int(await redis.eval(_LEGACY_APPEND, 3, seq, log, inbox, entry, now, *ttls))
