"""imroute-client sends its token in Sec-WebSocket-Protocol, not in the URL: a real
gateway behind a recording TCP proxy (what a logging proxy sees), the real push API,
Redis and the SDK. The gateway still takes `?token=` from older clients."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import redis.asyncio as aioredis
from imroute_client import ImrouteClient
from websockets.asyncio.client import connect

from router.processes.ports import free_port
from tests.integration.sdk import API, next_message, push, registered
from tests.integration.stack import api, gateway, one_group, recv_json, token

pytestmark = pytest.mark.integration


@dataclass
class RecordingProxy:
    """Forwards each connection to `target_port`, keeping its request head."""

    port: int
    target_port: int = 0
    heads: list[bytes] = field(default_factory=list)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def recording_proxy() -> AsyncIterator[RecordingProxy]:
    proxy = RecordingProxy(free_port())

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        proxy.heads.append(head)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", proxy.target_port)
        up_writer.write(head)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(serve, "127.0.0.1", proxy.port)
    try:
        yield proxy
    finally:
        server.close()


async def test_the_sdk_keeps_its_token_out_of_the_url(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    tok = token("alice")
    async with recording_proxy() as proxy:
        public = f"ws://127.0.0.1:{proxy.port}/ws"
        async with (
            gateway(redis_url, prefix, "gw1", "g1", ws_public_url=public) as gw,
            api(redis_url, prefix) as http,
            ImrouteClient(API, tok, http=http) as client,
        ):
            proxy.target_port = gw.ws_port
            await client.connect()
            await registered(redis, prefix, "alice")
            assert await push(http, "alice", "hi") == ["alice"]
            assert (await next_message(client)).content == "hi"
        (head,) = proxy.heads
        request_line, _, headers = head.partition(b"\r\n")
        assert request_line == b"GET /ws HTTP/1.1", request_line
        assert tok.encode() not in request_line and b"token" not in request_line
        assert f"Sec-WebSocket-Protocol: imroute.v1, imroute.jwt.{tok}".encode() in headers


async def test_the_sdk_logs_no_token_at_debug(
    redis_url: str, prefix: str, redis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Every logger at DEBUG, the websockets client's handshake lines among them: the
    token is in no record, whole or its signature (a real gateway, push API and Redis)."""
    caplog.set_level(logging.DEBUG)
    tok = token("alice")
    async with (
        one_group(redis_url, prefix) as (gw, http),
        ImrouteClient(API, tok, http=http) as client,
    ):
        await client.connect()
        await registered(redis, prefix, "alice")
        assert await push(http, "alice", "hi") == ["alice"]
        assert (await next_message(client)).content == "hi"
        assert len(gw.conns) == 1
    texts = [r.getMessage() for r in caplog.records]
    assert "> Sec-WebSocket-Protocol: imroute.v1, imroute.jwt.<redacted>" in texts, texts
    signature = tok.rsplit(".", 1)[1]
    assert [t for t in texts if signature in t] == []


async def test_the_gateway_still_takes_a_token_in_the_query(redis_url: str, prefix: str) -> None:
    async with gateway(redis_url, prefix, "gw1", "g1") as gw:
        async with connect(f"ws://127.0.0.1:{gw.ws_port}/ws?token={token('old')}") as ws:
            await ws.send('{"type":"ping"}')
            assert await recv_json(ws) == {"type": "pong"}
