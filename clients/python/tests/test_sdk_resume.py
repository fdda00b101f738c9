"""Positions and resume, which today's server does not send yet: a scripted gateway (a
real `websockets` server on loopback) sends `pos`, drains the client, and answers its
`since` with a `recovered` frame; dispatch is httpx's mock transport."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
from imroute_client import FilePosStore, ImrouteClient, Message, Recovered
from websockets.asyncio.server import ServerConnection, serve


def push(n: int, pos: str, **extra: Any) -> str:
    return json.dumps({"type": "push", "msg_id": f"m{n}", "push_id": f"p{n}", "msg_type": 0,
                       "from": "admin", "content": n, "ts": 1, "pos": pos, **extra})  # fmt: skip


async def test_pos_is_saved_sent_back_as_since_and_an_incomplete_resume_is_reported(
    tmp_path: Path,
) -> None:
    queries: list[dict[str, list[str]]] = []
    offers: list[str | None] = []  # Sec-WebSocket-Protocol: where the token travels

    async def gateway(ws: ServerConnection) -> None:
        assert ws.request is not None
        queries.append(parse_qs(urlsplit(ws.request.path).query))
        offers.append(ws.request.headers.get("Sec-WebSocket-Protocol"))
        if len(queries) == 1:
            await ws.send(push(1, "p-1"))
            await ws.send(push(2, "p-2"))
            await ws.send('{"type":"reconnect","reason":"drain"}')
            await ws.close(4503, "draining")
        elif len(queries) == 2:
            await ws.send(push(2, "p-2", recovered=True))  # already seen: dropped
            await ws.send(push(3, "p-3", recovered=True))
            await ws.send('{"type":"recovered","count":2,"complete":false}')
            await ws.send(push(4, "p-4"))  # live again
            await ws.wait_closed()
        else:
            await ws.wait_closed()

    async with serve(gateway, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        target = {"ws_url": f"ws://127.0.0.1:{port}/ws", "gateway_id": "gw1", "group_id": "g1"}
        mock = httpx.MockTransport(lambda request: httpx.Response(200, json=target))
        reports: list[Recovered] = []

        async def on_incomplete(rec: Recovered) -> None:
            reports.append(rec)

        store = FilePosStore(tmp_path / "pos")
        got: list[Message] = []
        async with (
            httpx.AsyncClient(transport=mock) as http,
            ImrouteClient(
                "http://api", "tok", http=http, pos_store=store, on_incomplete=on_incomplete
            ) as client,  # fmt: skip
        ):
            async for msg in client:
                got.append(msg)
                if msg.msg_id == "m2":
                    assert await store.load() == "p-1"  # m2 is not processed yet
                if msg.msg_id == "m4":
                    # Reported before the next message was handed over.
                    assert reports == [Recovered(2, False)] == [client.last_recovery]
                    break
            assert client.stats.duplicates == 1 and client.stats.moves == 1
        assert [(m.msg_id, m.pos, m.recovered) for m in got] == [
            ("m1", "p-1", False), ("m2", "p-2", False), ("m3", "p-3", True),
            ("m4", "p-4", False),
        ]  # fmt: skip
        # The token in a subprotocol, never in the URL (which proxies log).
        assert queries[0] == {} and offers[0] == "imroute.v1, imroute.jwt.tok"
        assert queries[1] == {"since": ["p-2"]} and offers[1] == "imroute.v1, imroute.jwt.tok"
        assert await store.load() == "p-4"  # left the loop normally: m4 is processed

        # A new client (a restarted app) resumes from the file.
        async with (
            httpx.AsyncClient(transport=mock) as http,
            ImrouteClient("http://api", "tok", http=http, pos_store=store) as client,
        ):
            assert client.pos == "p-4"
            await client.connect()
        assert queries[2] == {"since": ["p-4"]} and offers[2] == "imroute.v1, imroute.jwt.tok"
