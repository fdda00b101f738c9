"""The gateway's HTTP listeners bound a request head like the push service does
(shared.http_heads): its WebSocket port and its metrics port, against a real `imroute
gateway` process under attack (its memory, CPU and metrics port measured), each limit
answered in JSON; and /v1/dispatch refusing a token too long for the gateway's URL."""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import jwt
import pytest
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

from router.processes.ports import free_port
from shared.positions import MAX_POS_CHARS
from socket_gateway.ws.admission import REFUSALS
from tests.conftest import SECRET
from tests.integration.head_bombs import FIELDS, KIB, MIB, ask, send_head, send_heads, watching
from tests.integration.http_raw import Answer, request_head
from tests.integration.procs import BIN, Proc, gateway_env, read_until, running
from tests.integration.stack import handshake_refused, one_group, ready

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]


@contextmanager
def gateway_process(redis_url: str, prefix: str) -> Iterator[tuple[Proc, int, int]]:
    """A real `imroute gateway` with a metrics port: it, its WebSocket and metrics ports."""
    metrics = free_port()
    env = gateway_env(redis_url, prefix, IMROUTE_METRICS_PORT=str(metrics))
    argv = [str(BIN / "imroute"), "gateway", "--id", "gwh", "--group", "g1"]
    with running([*argv, "--ws-port", "0", "--grpc-port", "0"], env) as proc:
        line = read_until(proc, "ready")[-1]
        found = re.search(r"ws=ws://[^:]+:(\d+)/ws", line)
        assert found, line
        yield proc, int(found.group(1)), metrics


def scrape(port: int) -> str:
    answer = ask(port, request_head("GET", "/metrics"))
    assert answer.status == 200, answer
    return answer.body.decode()


def refused(answer: Answer | None, status: int, error: str) -> None:
    assert answer is not None and answer.status == status, answer
    assert answer.json()["error"] == error, answer
    assert answer.headers["connection"] == "close"


async def test_a_header_bomb_on_either_port_costs_the_gateway_nothing(
    redis_url: str, prefix: str
) -> None:
    with gateway_process(redis_url, prefix) as (proc, ws_port, metrics_port):
        probe = functools.partial(scrape, metrics_port)
        for port, path in ((ws_port, "/ws"), (metrics_port, "/metrics")):
            start = f"GET {path} HTTP/1.1\r\nHost: x\r\n".encode()
            async with watching(proc.pid, probe) as watch:
                got = await send_heads(8, port, start, FIELDS, total=12 * MIB)
            for one in got:
                refused(one.answer, 431, "headers_too_large")
                assert "IMROUTE_HTTP_MAX_HEAD_BYTES" in one.answer.json()["detail"]  # type: ignore[union-attr]
                assert one.sent < 12 * MIB
            assert watch.grew_mib < 50, watch
            assert watch.slowest_probe_s < 1.0, watch.probes_s
        # One huge value in pieces: cut at the limit, at no cost.
        async with watching(proc.pid, probe) as watch:
            got1 = await asyncio.to_thread(
                send_head, ws_port, b"GET /ws HTTP/1.1\r\nX-Big: ", b"a" * 64 * KIB, 63 * MIB
            )
        refused(got1.answer, 431, "headers_too_large")
        assert watch.cpu_s < 1.0 and watch.grew_mib < 50, watch
        text = scrape(metrics_port)
        assert "imroute_gateway_handshakes_refused_headers_too_large_total 9.0" in text
        assert "imroute_gateway_metrics_heads_refused_total 8.0" in text


async def test_each_limit_is_answered_in_json_on_both_ports(redis_url: str, prefix: str) -> None:
    with gateway_process(redis_url, prefix) as (_, ws_port, metrics_port):
        fields = {f"X_{i}": "v" for i in range(100)}  # 101 with Host
        for port, path in ((ws_port, "/ws?token="), (metrics_port, "/metrics?")):
            room = 8000 - len(path)
            # A target at the limit is taken (the token checked, or the scrape answered)...
            answer = ask(port, request_head("GET", path + "a" * room))
            assert answer.status not in (414, 431), answer
            assert answer.json()["error"] if answer.status != 200 else answer.body
            # ...and one byte more is a 414 in JSON (the WebSocket library's was text).
            answer = ask(port, request_head("GET", path + "a" * (room + 1)))
            refused(answer, 414, "uri_too_long")
            assert "IMROUTE_HTTP_MAX_URL_BYTES" in answer.json()["detail"]
            refused(ask(port, request_head("GET", path, **fields)), 431, "too_many_headers")
            # A whole head over the limit in one write (its end in sight) is refused too.
            big = request_head("GET", path, X_A="a" * 6000, X_B="b" * 6000, X_C="c" * 6000)
            refused(ask(port, big), 431, "headers_too_large")
        # One header line over the library's own 8 KiB, in a head within ours: JSON too.
        answer = ask(ws_port, request_head("GET", "/ws", X_Pad="a" * 9000))
        refused(answer, 431, "headers_too_large")
        text = scrape(metrics_port)
        assert "imroute_gateway_handshakes_refused_uri_too_long_total 1.0" in text
        assert "imroute_gateway_handshakes_refused_too_many_headers_total 1.0" in text
        assert "imroute_gateway_handshakes_refused_headers_too_large_total 2.0" in text
        assert "imroute_gateway_metrics_heads_refused_total 3.0" in text
    assert {"headers_too_large", "too_many_headers", "uri_too_long"} <= set(REFUSALS)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _padded_token(uid: str, size: int) -> str:
    """A valid client token of `size` bytes or one less (a claim pads it: base64 does
    not come in every length)."""
    now = int(time.time())

    def of(pad: int) -> str:
        claims = {"sub": uid, "iat": now, "exp": now + 3600, "pad": "p" * pad}
        return jwt.encode(claims, SECRET, algorithm="HS256")

    pad = size - len(of(0))
    while len(of(pad)) > size:
        pad -= 1
    token = of(pad)
    assert size - 1 <= len(token) <= size, (len(token), size)
    return token


async def test_dispatch_refuses_a_token_the_gateways_url_could_not_carry(
    redis_url: str, prefix: str
) -> None:
    """The finding: /v1/dispatch accepted a 15-KB token that the gateway then refused
    with a plain-text 414. Both now read one setting, IMROUTE_HTTP_MAX_URL_BYTES."""
    async with one_group(redis_url, prefix) as (gw, http):
        huge = _padded_token("alice", 15 * KIB)
        resp = await http.get("/v1/dispatch", headers={"Authorization": f"Bearer {huge}"})
        assert resp.status_code == 422, resp.text
        [problem] = resp.json()["detail"]
        assert problem["field"] == "token"
        assert "IMROUTE_HTTP_MAX_URL_BYTES" in problem["message"]
        assert f"is {len(huge)} bytes; a gateway takes at most 7727" in problem["message"]
        url = f"ws://127.0.0.1:{gw.ws_port}/ws?token={huge}"
        async with httpx.AsyncClient() as plain:
            answer = await plain.get(url.replace("ws://", "http://"))
        assert answer.status_code == 414 and answer.json()["error"] == "uri_too_long"
        # The longest token dispatch takes, the gateway takes too: in the URL with the
        # longest position a client resumes from (before: 7990, and a resume got a 414)...
        assert (
            await http.get("/v1/dispatch", headers=bearer(_padded_token("a", 7728)))
        ).status_code == 422
        fits = _padded_token("alice", 7727)  # 8000 less "/ws?token=&since=" and 256
        resp = await http.get("/v1/dispatch", headers=bearer(fits))
        assert resp.status_code == 200, resp.text
        since = "x" * MAX_POS_CHARS  # not a position the gateway wrote: 101, then a close
        async with connect(f"{resp.json()['ws_url']}?token={fits}&since={since}") as ws:
            assert ws.response.status_code == 101
        async with connect(f"{resp.json()['ws_url']}?token={fits}") as ws:
            await ready(ws)
        # ...and in the header form, whose line the gateway's library takes up to 8192
        # bytes: the room dispatch leaves it, and one byte past the line.
        offer = [Subprotocol("imroute.v1"), Subprotocol(f"imroute.jwt.{fits}")]
        async with connect(resp.json()["ws_url"], subprotocols=offer) as ws:
            await ready(ws)
        line = len("Sec-WebSocket-Protocol: imroute.v1, imroute.jwt.\r\n")
        at_line = _padded_token("alice", 8192 - line)
        async with connect(
            resp.json()["ws_url"], subprotocols=[*offer[:1], Subprotocol(f"imroute.jwt.{at_line}")]
        ) as ws:
            await ready(ws)
        past = f"imroute.jwt.{at_line}" + "p" * (8192 - line - len(at_line) + 1)
        answer = await handshake_refused(
            resp.json()["ws_url"], subprotocols=[*offer[:1], Subprotocol(past)]
        )
        assert answer.status_code == 431
