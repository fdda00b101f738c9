"""The WebSocket endpoint's opening handshake (socket_gateway/ws/conn.py): HTTP
answers, the token (401 before any 101, in the query or a subprotocol), the limits on
sockets without a 101, deadlines, and the route registered after the 101."""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from typing import Any

import jwt
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from websockets.typing import Subprotocol

from router.routes.registry import RedisRouteRegistry
from shared.clock import SystemClock
from shared.errors import RegistryUnavailable
from socket_gateway.ws.protocol import WsTimers
from tests.conftest import SECRET
from tests.integration.stack import (
    RawClient,
    closed_with,
    endpoint,
    endpoint_client,
    handshake_refused,
    recv_json,
    routes,
    token,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]

V1 = Subprotocol("imroute.v1")


# --------------------------------------------------------------------------- auth


def _bad_tokens() -> dict[str, str]:
    now = SystemClock().now_ms() // 1000
    return {
        "none": "",
        "garbage": "?token=not.a.jwt",
        # Past the 30 s leeway.
        "expired": "?token=" + jwt.encode({"sub": "alice", "exp": now - 60}, SECRET, "HS256"),
        "wrong-secret": "?token="
        + jwt.encode({"sub": "alice", "exp": now + 60}, "w" * 32, "HS256"),
        "no-sub": "?token=" + jwt.encode({"exp": now + 60}, SECRET, "HS256"),
        # Over the default IMROUTE_JWT_MAX_TTL_S (a day).
        "too-long": "?token=" + jwt.encode({"sub": "alice", "exp": 2**40}, SECRET, "HS256"),
    }


@pytest.mark.parametrize("bad", list(_bad_tokens()))
async def test_bad_tokens_get_401_with_json_and_no_101(
    redis_url: str, prefix: str, redis: Any, bad: str
) -> None:
    # Long deadlines: the socket must be closed because it was refused, not by a timer.
    timers = WsTimers(handshake_s=30, close_s=30)
    async with endpoint(redis_url, prefix, timers=timers) as gw:
        raw = await RawClient.open(gw)
        raw.writer.write(RawClient.request("alice", query=_bad_tokens()[bad]))
        head, body = await raw.response()
        assert head.startswith(b"HTTP/1.1 401 ")
        assert b"content-type: application/json" in head.lower()
        answer = json.loads(body)
        assert answer["error"] == "unauthorized" and answer["detail"]  # says why
        assert await raw.at_eof(2)
        # Closed by the gateway right after the answer, while the client keeps its end.
        await wait_for(lambda: not gw.endpoint._live, "the socket closed", timeout=2)
        raw.close()
        assert gw.endpoint.refusals.counts["unauthorized"] == 1
        assert len(gw.conns) == 0 and gw.calls == []
        assert await redis.exists(gw.keys.route("alice")) == 0


async def test_a_websockets_client_sees_the_401(redis_url: str, prefix: str) -> None:
    async with endpoint(redis_url, prefix) as gw:
        response = await handshake_refused(gw.url("?token=not.a.jwt"))
        assert response.status_code == 401
        assert json.loads(response.body)["error"] == "unauthorized"


async def test_the_token_can_travel_as_a_subprotocol_and_is_never_echoed(
    redis_url: str, prefix: str
) -> None:
    tok = token("alice")
    async with endpoint(redis_url, prefix) as gw:
        # As a browser sends it: new WebSocket(url, ["imroute.v1", "imroute.jwt." + token]).
        offer = [Subprotocol("imroute.v1"), Subprotocol(f"imroute.jwt.{tok}")]
        async with connect(gw.url(), subprotocols=offer) as ws:
            assert ws.subprotocol == "imroute.v1"
            assert ws.response is not None
            assert ws.response.headers.get_all("Sec-WebSocket-Protocol") == ["imroute.v1"]
            await wait_for(lambda: [c.uid for c in gw.conns] == ["alice"], "alice in the map")
            await ws.send('{"type":"ping"}')
            assert await recv_json(ws) == {"type": "pong"}
        # Nothing of the token in the answer's bytes.
        raw = await RawClient.open(gw)
        raw.writer.write(
            RawClient.request(
                "bob", query="", extra=f"Sec-WebSocket-Protocol: imroute.v1, imroute.jwt.{tok}\r\n"
            )
        )
        head = await raw.response_head()
        assert b" 101 " in head and b"Sec-WebSocket-Protocol: imroute.v1\r\n" in head
        assert tok.encode() not in head and b"jwt" not in head
        raw.close()
        # A bad token in the subprotocol is refused like one in the query.
        answer = await handshake_refused(
            gw.url(), subprotocols=[V1, Subprotocol("imroute.jwt.x.y.z")]
        )
        assert answer.status_code == 401


async def test_the_token_is_never_logged(
    redis_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    good, expired = token("alice"), token("alice", ttl=1)
    bad = jwt.encode({"sub": "alice", "exp": 2**40}, "w" * 32, "HS256")
    caplog.set_level(logging.DEBUG)
    async with endpoint(redis_url, prefix) as gw:
        async with connect(gw.url(f"?token={good}")) as ws:
            await ws.send('{"type":"ping"}')
            await recv_json(ws)
        for query in (f"?token={bad}", f"?token={expired}&since=x", f"?token={good}&x=1"):
            raw = await RawClient.open(gw)
            raw.writer.write(RawClient.request("alice", query=query))
            await raw.response()
            raw.close()
        with pytest.raises(InvalidStatus):
            await connect(gw.url(), subprotocols=[V1, Subprotocol(f"imroute.jwt.{bad}")])
        await wait_for(lambda: not gw.endpoint._live, "all gone")
    gateway_side = [r for r in caplog.records if not r.name.startswith("websockets.client")]
    assert any(r.name.startswith("socket_gateway") for r in gateway_side)  # it did log
    text = "\n".join(r.getMessage() for r in gateway_side)
    for t in (good, expired, bad):
        assert t.split(".")[2] not in text


# --------------------------------------------------------------------------- HTTP


async def test_wrong_path_is_404_with_a_text_body(
    redis_url: str,
    prefix: str,
) -> None:
    async with endpoint(redis_url, prefix) as gw:
        answer = await handshake_refused(gw.url(f"?token={token('a')}", path="/other"))
        assert answer.status_code == 404
        assert json.loads(answer.body) == {
            "error": "not_found",
            "detail": "the WebSocket endpoint is /ws?token=<JWT>",
        }
        assert len(gw.conns) == 0


async def test_not_accepting_and_full_are_503_with_json_and_retry_after(
    redis_url: str, prefix: str
) -> None:
    async with endpoint(redis_url, prefix, max_connections=1) as gw:
        async with endpoint_client(gw, "a"):
            full = await handshake_refused(gw.url(f"?token={token('b')}"))
            assert full.status_code == 503 and full.headers["Retry-After"] == "2"
            assert json.loads(full.body)["error"] == "gateway_full"
            assert [c.uid for c in gw.conns] == ["a"]
        await wait_for(lambda: len(gw.conns) == 0, "a gone")
        gw.endpoint.accepting = False  # draining or shutting down
        draining = await handshake_refused(gw.url(f"?token={token('a')}"))
        assert draining.status_code == 503 and draining.headers["Retry-After"] == "2"
        assert json.loads(draining.body)["error"] == "unavailable"
        assert [c[1] for c in gw.calls if c[0] == "register"] == ["a"]
        counts = gw.endpoint.refusals.counts
        assert (counts["full"], counts["not_accepting"]) == (1, 1)


async def test_plain_http_request_is_refused(
    redis_url: str,
    prefix: str,
) -> None:
    async with endpoint(redis_url, prefix) as gw:
        raw = await RawClient.open(gw)
        raw.writer.write(b"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n")
        head, body = await raw.response()
        assert head.startswith(b"HTTP/1.1 426 ") and b"\r\nUpgrade: websocket\r\n" in head
        assert json.loads(body)["error"] == "bad_handshake"
        raw.close()
        raw = await RawClient.open(gw)
        raw.writer.write(b"\x16\x03\x01 not http at all\r\n\r\n")
        assert await raw.at_eof()
        raw.close()
        await wait_for(lambda: len(gw.conns) == 0, "nothing registered")
        assert gw.calls == []


async def test_oversized_handshake_is_431(redis_url: str, prefix: str) -> None:
    async with endpoint(redis_url, prefix) as gw:
        raw = await RawClient.open(gw)
        raw.writer.write(b"GET /ws HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 20_000)
        head = await raw.response_head()
        assert head.startswith(b"HTTP/1.1 431 ")
        raw.close()
        await wait_for(lambda: not gw.endpoint._live, "dropped")


async def test_handshake_and_frames_in_one_segment(redis_url: str, prefix: str) -> None:
    # Clients should wait for the 101 (RFC 6455 4.1); the `websockets` server writes its
    # pong to a pipelined ping before the 101, so this is checked on the sans-I/O one only.
    async with endpoint(redis_url, prefix) as gw:
        raw = await RawClient.open(gw)
        ping = RawClient.frame(0x1, b'{"type":"ping"}')
        raw.writer.write(RawClient.request("alice") + ping + RawClient.frame(0x9, b"p"))
        assert b" 101 " in await raw.response_head()
        frames = {await raw.read_frame(), await raw.read_frame()}
        assert frames == {(0x1, b'{"type":"pong"}'), (0xA, b"p")}
        # A close from the client is echoed and the connection ends.
        raw.writer.write(RawClient.frame(0x8, struct.pack("!H", 1000) + b"bye"))
        assert await raw.read_frame() == (0x8, struct.pack("!H", 1000) + b"bye")
        assert await raw.at_eof()
        raw.close()
        await gw.let_go()


# --------------------------------------------------------------------------- routes


async def test_register_then_disconnect_removes_the_route(
    redis_url: str,
    prefix: str,
    redis: Any,
) -> None:
    async with endpoint(redis_url, prefix) as gw:
        async with endpoint_client(gw, "alice"):
            (conn,) = list(gw.conns)
            fields = await routes(redis, gw, "alice")
            assert list(fields) == [conn.conn_id]
            assert fields[conn.conn_id].startswith("gw1|g1|127.0.0.1|5000|")
            found = await gw.registry.lookup(["alice"])
            assert [r.conn_id for r in found["alice"]] == [conn.conn_id]
        await gw.let_go("local removal")
        await asyncio.sleep(0.05)
        assert await routes(redis, gw, "alice") == {}


async def test_registry_down_closes_1013(
    redis_url: str,
    prefix: str,
) -> None:
    async def down(uid: str, conn_id: str) -> None:
        raise RegistryUnavailable("redis did not answer: test")

    async with endpoint(redis_url, prefix, register=down, unregister=down) as gw:
        async with connect(gw.url(f"?token={token('alice')}")) as ws:
            code, _ = await closed_with(ws)
        assert code == 1013
        await gw.let_go()  # the unregister was attempted (and its failure only logged)


async def test_an_outage_logs_one_line_for_every_connection_it_closes(
    redis_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each connection a route registry outage closed 1013 was a line of its own, and its
    unregister another (a reconnect storm against a Redis that is down: two lines per
    client per attempt); now each kind is one line per 10 s with the count."""

    async def down(uid: str, conn_id: str) -> None:
        raise RegistryUnavailable("redis did not answer: test")

    async with endpoint(redis_url, prefix, register=down, unregister=down) as gw:
        with caplog.at_level(logging.WARNING, logger="socket_gateway.ws.conn"):
            for i in range(20):
                async with connect(gw.url(f"?token={token(f'u{i}')}")) as ws:
                    assert (await closed_with(ws))[0] == 1013
            await gw.let_go()
        ep = gw.endpoint
        await wait_for(lambda: ep.unregister_failed.total == 20, "20 unregisters failed")
        assert ep.register_failed.total == 20
    # The first of each at once, the rest at the window's end (10 s: the test is over
    # by then, unless a slow machine took that long).
    said = [r.getMessage() for r in caplog.records]
    assert 1 <= len([m for m in said if "(1013)" in m]) <= 2, said
    assert 1 <= len([m for m in said if "could not remove the routes" in m]) <= 2, said
    assert not [m for m in said if m.startswith(("register or replay", "unregister "))]


async def test_client_gone_during_register_is_unregistered_after_it(
    redis_url: str,
    prefix: str,
    redis: Any,
) -> None:
    release = asyncio.Event()
    holder: dict[str, RedisRouteRegistry] = {}

    async def slow(uid: str, conn_id: str) -> None:
        await release.wait()
        await holder["registry"].register(uid, conn_id)

    async with endpoint(redis_url, prefix, register=slow) as gw:
        holder["registry"] = gw.registry
        raw = await RawClient.open(gw)
        raw.writer.write(RawClient.request("alice"))
        assert b" 101 " in await raw.response_head()
        await wait_for(lambda: len(gw.conns) == 1, "in the map")
        raw.close()  # TCP reset while the register is in flight
        await wait_for(lambda: len(gw.conns) == 0, "local removal")
        await asyncio.sleep(0.2)
        assert [c[0] for c in gw.calls] == ["register"]  # no unregister overtaking it
        release.set()
        await wait_for(lambda: [c[0] for c in gw.calls][-1:] == ["unregister"], "unregister")
        assert [c[0] for c in gw.calls] == ["register", "registered", "unregister"]
        assert len(gw.conns) == 0
        await asyncio.sleep(0.05)
        assert await routes(redis, gw, "alice") == {}
