"""Handshakes a gateway answers with HTTP instead of 101: a scripted gateway (a real
`websockets` server on loopback, refusing in `process_request`) answers 503, 429 and
401 as imroute's gateways do; dispatch is httpx's mock transport."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from imroute_client import ImrouteClient, Unauthorized
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

PUSH = json.dumps(
    {"type": "push", "msg_id": "m1", "push_id": "p1", "msg_type": 0, "from": "admin",
     "content": 1, "ts": 1}
)  # fmt: skip


def refusal(status: int, error: str, retry_after: str | None = None) -> Response:
    body = json.dumps({"error": error, "detail": f"{error}, says the gateway"}).encode()
    headers = Headers([("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    return Response(status, "Refused", headers, body)


@asynccontextmanager
async def scripted(answers: list[Response | None]) -> AsyncIterator[tuple[str, list[float]]]:
    """A gateway that answers its handshakes with `answers` in turn (None: a 101), and
    the loop times at which they came."""
    times: list[float] = []

    def process_request(_: ServerConnection, request: Request) -> Response | None:
        times.append(asyncio.get_running_loop().time())
        return answers[min(len(times), len(answers)) - 1]

    async def handler(ws: ServerConnection) -> None:
        await ws.send(PUSH)
        await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0, process_request=process_request) as server:
        port = server.sockets[0].getsockname()[1]
        yield f"ws://127.0.0.1:{port}/ws", times


def dispatch_to(ws_url: str, asked: list[int]) -> httpx.MockTransport:
    def answer(_: httpx.Request) -> httpx.Response:
        asked.append(1)
        return httpx.Response(200, json={"ws_url": ws_url, "gateway_id": "gw1", "group_id": "g1"})

    return httpx.MockTransport(answer)


@pytest.mark.parametrize(("status", "error"), [(503, "gateway_full"), (429, "rate_limited")])
async def test_503_and_429_ask_dispatch_again_after_retry_after(status: int, error: str) -> None:
    asked: list[int] = []
    async with (
        scripted([refusal(status, error, retry_after="1"), None]) as (url, times),
        httpx.AsyncClient(transport=dispatch_to(url, asked)) as http,
        ImrouteClient("http://api", "tok", http=http, rand=lambda: 0.0) as client,
    ):
        msg = await asyncio.wait_for(client.__anext__(), 10)
        assert msg.msg_id == "m1"
        assert client.stats.refused == 1 and client.stats.connects == 1
        assert len(asked) == 2  # "try another gateway": through dispatch
        assert client.stats.transport_errors == 0
    assert times[1] - times[0] >= 0.95  # Retry-After: 1, not the 0.1 s backoff


async def test_a_401_at_the_handshake_is_unauthorized_for_good() -> None:
    asked: list[int] = []
    async with (
        scripted([refusal(401, "unauthorized")]) as (url, times),
        httpx.AsyncClient(transport=dispatch_to(url, asked)) as http,
        ImrouteClient("http://api", "tok", http=http) as client,
    ):
        with pytest.raises(Unauthorized, match="HTTP 401: unauthorized, says the gateway"):
            await client.connect()
        with pytest.raises(Unauthorized):
            await client.connect()
        assert len(times) == 1 and len(asked) == 1  # never retried


async def test_other_answers_are_retried_through_dispatch_after_a_backoff() -> None:
    asked: list[int] = []
    async with (
        scripted([refusal(404, "not_found"), None]) as (url, times),
        httpx.AsyncClient(transport=dispatch_to(url, asked)) as http,
        ImrouteClient("http://api", "tok", http=http) as client,
    ):
        await asyncio.wait_for(client.connect(), 10)
        assert len(times) == 2 and len(asked) == 2
        assert client.stats.refused == 0


async def test_failed_connects_go_to_another_gateway_naming_the_one_they_failed_on() -> None:
    """gw1 refuses every connect (its port is closed): after `retries_same` retries
    there, dispatch is asked with avoid=gw1 and names gw2, where the client stays."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"ws://127.0.0.1:{s.getsockname()[1]}/ws"
    asks: list[httpx.Request] = []
    async with scripted([None]) as (live, _times):

        def answer(request: httpx.Request) -> httpx.Response:
            asks.append(request)
            # As dispatch does: gw1 (the emptiest) unless the client avoids it.
            if request.url.params.get("avoid") == "gw1":
                return httpx.Response(200, json={"ws_url": live, "gateway_id": "gw2",
                                                 "group_id": "g1"})  # fmt: skip
            return httpx.Response(200, json={"ws_url": dead, "gateway_id": "gw1",
                                             "group_id": "g1"})  # fmt: skip

        async with (
            httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http,
            ImrouteClient(
                "http://api", "tok", http=http, rand=lambda: 0.0, backoff_min_s=0.01
            ) as client,
        ):
            msg = await asyncio.wait_for(client.__anext__(), 10)
            assert msg.msg_id == "m1" and client.gateway_id == "gw2"
            # 1 connect + retries_same (2) on gw1, then one dispatch naming it.
            assert client.stats.transport_errors == 3 and client.stats.same_retries == 2
            assert [r.url.params.get("avoid") for r in asks] == [None, "gw1"]
            assert client.stats.avoided == 1 and client.stats.dispatches == 2
