"""The push service's request heads are bounded in bytes, header fields and target length
(push_service.head_limits): against a real `python -m push_service` under attack, its
memory, CPU and /healthz measured; and, for each of uvicorn's HTTP parsers, an
in-process server at each limit and past it."""

from __future__ import annotations

import asyncio
import functools
import re
import socket
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from starlette.types import Receive, Scope, Send

from push_service.http_server import (
    RESPONSE_HEADERS,
    HeadCounts,
    HeadCuts,
    Parser,
    head_deadline_protocol,
)
from shared.http_heads import HeadLimits
from tests.integration.head_bombs import FIELDS, KIB, MIB, ask, send_head, send_heads, watching
from tests.integration.http_raw import (
    HOST,
    lifespan_done,
    push_service,
    read_answer,
    read_answer_blocking,
    request_head,
    uvicorn_on,
)
from tests.integration.procs import read_until

pytestmark = pytest.mark.integration

LIMITS = HeadLimits()
HEAD_START = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"


def healthz(port: int) -> None:
    answer = ask(port, request_head("GET", "/healthz"))
    assert answer.status == 200, answer


def head_of(size: int, target: str = "/") -> bytes:
    """A GET head of exactly `size` bytes (a padding field makes up the rest)."""
    start = f"GET {target} HTTP/1.1\r\nHost: x\r\nX-Pad: ".encode()
    return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"


def with_fields(n: int) -> bytes:
    """A GET head of `n` header fields, Host included."""
    return request_head("GET", "/", **{f"X_{i}": "v" for i in range(n - 1)})


# ----------------------------------------------------------------- the real process


@pytest.mark.usefixtures("redis")
async def test_a_header_bomb_on_eight_sockets_costs_the_push_service_nothing(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """The finding: eight sockets with no key sent 90 MB of headers; the worker grew
    from 130 MB to 1.9 GB and /healthz took 11 s. Now each is cut at its 101st field
    (or 16 KiB) with 431. (Before: 96 MB of short fields grew the process by 1 GB.)"""
    with push_service(redis_url, prefix, tmp_path) as (proc, port):
        healthz(port)
        async with watching(proc.pid, functools.partial(healthz, port)) as watch:
            got = await send_heads(8, port, HEAD_START, FIELDS, total=12 * MIB)
        for one in got:
            assert one.answer is not None and one.answer.status == 431, one
            assert one.answer.json()["error"] == "too_many_headers"
            assert "IMROUTE_HTTP_MAX_HEADERS" in one.answer.json()["detail"]
            assert one.answer.headers["connection"] == "close"
            assert one.sent < 12 * MIB  # cut: the rest could not be sent
        assert watch.grew_mib < 50, watch
        assert watch.slowest_probe_s < 1.0, watch.probes_s
        # Counted for /metrics, and in one log line (then at most one every 10 s).
        scrape = ask(port, request_head("GET", "/metrics")).body.decode()
        assert 'imroute_http_heads_refused_total{reason="too_many_headers"} 8.0' in scrape
        read_until(proc, "refused 1 request head(s) (431): the request has over 100 header", 5)


@pytest.mark.usefixtures("redis")
async def test_one_huge_header_value_in_pieces_is_cut_at_the_limit(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """The finding: one 63-MB value in pieces stalled the loop about 8 s (the parser
    joins the pieces with +=, quadratic). Now the parser never sees more than 16 KiB."""
    with push_service(redis_url, prefix, tmp_path) as (proc, port):
        healthz(port)
        async with watching(proc.pid, functools.partial(healthz, port)) as watch:
            got = await asyncio.to_thread(
                send_head, port, HEAD_START + b"X-Big: ", b"a" * 64 * KIB, 63 * MIB
            )
        assert got.answer is not None and got.answer.status == 431, got
        assert got.sent < 32 * MIB
        assert watch.cpu_s < 1.0, watch
        assert watch.slowest_probe_s < 1.0, watch.probes_s
        assert watch.grew_mib < 50, watch


@pytest.mark.usefixtures("redis")
async def test_fields_and_targets_over_their_limits_are_refused_by_the_process(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    env = {"IMROUTE_HTTP_MAX_HEADERS": "20", "IMROUTE_HTTP_MAX_URL_BYTES": "1000"}
    with push_service(redis_url, prefix, tmp_path, **env) as (_, port):
        assert ask(port, with_fields(20)).status == 404  # GET / is no route
        answer = ask(port, with_fields(21))
        assert answer.status == 431 and answer.json()["error"] == "too_many_headers"
        assert "over 20 header fields (IMROUTE_HTTP_MAX_HEADERS)" in answer.json()["detail"]
        assert ask(port, request_head("GET", "/healthz?" + "a" * 991)).status == 200
        answer = ask(port, request_head("GET", "/healthz?" + "a" * 992))
        assert answer.status == 414 and answer.json()["error"] == "uri_too_long"
        assert "over 1000 bytes (IMROUTE_HTTP_MAX_URL_BYTES)" in answer.json()["detail"]
        scrape = ask(port, request_head("GET", "/metrics")).body.decode()
        assert 'imroute_http_heads_refused_total{reason="too_many_headers"} 1.0' in scrape
        assert 'imroute_http_heads_refused_total{reason="uri_too_long"} 1.0' in scrape


@pytest.mark.usefixtures("redis")
async def test_over_limit_heads_after_a_body_or_pipelined_are_refused_by_the_process(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """The finding, against the real process: a head over the limit behind a body's last
    bytes in one read, or pipelined behind a GET, reached the app."""
    big = HEAD_START + b"X-Big: " + b"a" * (40 * KIB) + b"\r\n\r\n"
    with push_service(redis_url, prefix, tmp_path) as (_, port):
        for first, then in (
            (POST_10, b"0123456789" + big),
            (b"", request_head("GET", "/healthz") + big),
        ):
            answers = await _over_limit_after(port, first, then)
            assert [a.status for a in answers][1:] in ([431], []), answers
            assert answers[-1].status == 431, answers
            assert answers[-1].json()["error"] == "headers_too_large"
        scrape = ask(port, request_head("GET", "/metrics")).body.decode()
        assert 'imroute_http_heads_refused_total{reason="headers_too_large"} 2.0' in scrape


@pytest.mark.usefixtures("redis")
async def test_upgrade_requests_are_logged_at_a_throttled_rate(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """The finding: each upgrade request logged two uvicorn warnings, unthrottled; the
    second advised installing a WebSocket library (the push service serves none)."""
    with push_service(redis_url, prefix, tmp_path) as (proc, port):
        upgrade = request_head("GET", "/healthz", Upgrade="websocket", Connection="Upgrade")
        for _ in range(30):
            assert ask(port, upgrade).status == 200
        assert ask(port, with_fields(101)).status == 431  # its line marks the end
        lines = read_until(proc, "refused 1 request head(s) (431)", 10)
        assert sum("serves no WebSocket" in line for line in lines) == 1, lines
        assert not any("No supported WebSocket library" in line for line in lines), lines
        assert not any("Unsupported upgrade request" in line for line in lines), lines


# ----------------------------------------------------------------- both parsers


async def _echo(scope: Scope, receive: Receive, send: Send) -> None:
    """200 with the size of the body it read."""
    if await lifespan_done(scope, receive, send):
        return
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = str(size).encode()
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(params=["h11", "httptools"])
def parser(request: pytest.FixtureRequest) -> Parser:
    """Each parser uvicorn reads heads with."""
    name: Parser = request.param
    return name


def _uvicorn(parser: Parser, counts: HeadCounts) -> AbstractAsyncContextManager[int]:
    protocol = head_deadline_protocol(5.0, parser, LIMITS, counts)
    return uvicorn_on(_echo, protocol, headers=RESPONSE_HEADERS)


async def test_both_parsers_take_a_head_at_each_limit_and_refuse_one_past_it(
    parser: Parser,
) -> None:
    counts = HeadCounts(HeadCuts(5.0))
    async with _uvicorn(parser, counts) as port:
        ok = functools.partial(asyncio.to_thread, ask, port)
        exact = head_of(LIMITS.max_bytes)
        for request in (exact, with_fields(100), request_head("GET", "/" + "a" * 7999)):
            answer = await ok(request)
            assert answer.status == 200, answer
            assert answer.headers["x-content-type-options"] == "nosniff"
        # ...and the same as one read, a byte at a time, or in pieces of 1000 bytes.
        for piece in (1, 1000):
            with socket.create_connection((HOST, port), timeout=10) as sock:
                for at in range(0, len(exact), piece):
                    sock.sendall(exact[at : at + piece])
                assert (await asyncio.to_thread(read_answer_blocking, sock)).status == 200  # type: ignore[union-attr]
        past = {
            "headers_too_large": head_of(LIMITS.max_bytes + 1),
            "too_many_headers": with_fields(101),
            "uri_too_long": request_head("GET", "/" + "a" * 8000),
        }
        for error, request in past.items():
            answer = await ok(request)
            assert answer.status == (414 if error == "uri_too_long" else 431), answer
            assert answer.json()["error"] == error
            assert answer.headers["connection"] == "close"
            assert answer.headers["x-content-type-options"] == "nosniff"
        # A value without end, in pieces: cut at the limit, the rest never read.
        got = await asyncio.to_thread(send_head, port, HEAD_START, b"a" * KIB, 64 * MIB)
        assert got.answer is not None and got.answer.json()["error"] == "headers_too_large"
        assert got.sent < 32 * MIB
        assert counts.refusals.counts == {
            "headers_too_large": 2,
            "too_many_headers": 1,
            "uri_too_long": 1,
        }


async def test_bodies_and_keep_alive_requests_do_not_eat_the_next_heads_room(
    parser: Parser,
) -> None:
    counts = HeadCounts(HeadCuts(5.0))
    async with _uvicorn(parser, counts) as port:
        reader, writer = await asyncio.open_connection(HOST, port)
        # 200 requests of 4 KiB bodies (800 KiB) on one connection.
        post = request_head("POST", "/", Content_Length=str(4 * KIB))
        for _ in range(200):
            writer.write(post + b"b" * 4 * KIB)
            answer = await read_answer(reader, timeout=5)
            assert answer is not None and answer.body == b"4096", answer
        # 20 requests in one write (pipelined), each near the limit.
        writer.write(head_of(LIMITS.max_bytes - 10) * 20)
        for _ in range(20):
            answer = await read_answer(reader, timeout=5)
            assert answer is not None and answer.status == 200, answer
        # A head near the limit and a 1 MiB body in one write.
        start = head_of(LIMITS.max_bytes - 30)[:-2]
        writer.write(start + f"Content-Length: {MIB}\r\n\r\n".encode() + b"b" * MIB)
        answer = await read_answer(reader, timeout=5)
        assert answer is not None and answer.body == str(MIB).encode(), answer
        writer.close()
        assert not counts.refusals.counts


async def _over_limit_after(port: int, first: bytes, then: bytes) -> list[bytes]:
    """The answers on one connection to `first`, then (a moment later, in one write) `then`."""
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(first)
    await asyncio.sleep(0.2)
    writer.write(then)
    answers = []
    while (answer := await read_answer(reader, timeout=5)) is not None:
        answers.append(answer)
    writer.close()
    return answers


BIG_HEAD = HEAD_START + b"X-Big: " + b"a" * (120 * KIB) + b"\r\n\r\n"
POST_10 = b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n"


@pytest.mark.parametrize("size", [60 * KIB, 120 * KIB])
async def test_over_limit_head_after_a_body_in_one_read_is_refused(
    parser: Parser, size: int
) -> None:
    """The finding: a body's last bytes and a 60 or 120 KB head in one read went to the
    parser uncounted, and the head reached the app (200)."""
    counts = HeadCounts(HeadCuts(5.0))
    async with _uvicorn(parser, counts) as port:
        big = HEAD_START + b"X-Big: " + b"a" * size + b"\r\n\r\n"
        answers = await _over_limit_after(port, POST_10, b"0123456789" + big)
        # (Refused as soon as it is read: the POST's answer may not be out by then.)
        assert [a.status for a in answers] in ([200, 431], [431]), answers
        assert answers[-1].json()["error"] == "headers_too_large"
        assert counts.refusals.counts == {"headers_too_large": 1}


async def test_over_limit_pipelined_head_is_refused(parser: Parser) -> None:
    """The finding: under h11 a 120-KB head pipelined behind a GET waited whole in h11's
    buffer, where its limit does not look, and reached the app."""
    counts = HeadCounts(HeadCuts(5.0))
    async with _uvicorn(parser, counts) as port:
        answers = await _over_limit_after(port, b"", request_head("GET", "/") + BIG_HEAD)
        # (httptools refuses it as soon as it is read: the GET's answer may not be out.)
        assert [a.status for a in answers] in ([200, 431], [431]), answers
        assert answers[-1].json()["error"] == "headers_too_large"
        assert counts.refusals.counts == {"headers_too_large": 1}


def test_the_push_services_metrics_name_every_reason() -> None:
    counts = HeadCounts(HeadCuts(5.0))
    text = "\n".join(f"{s.name}{s.labels} {s.value}" for m in counts.collect() for s in m.samples)
    for reason in ("headers_too_large", "too_many_headers", "uri_too_long"):
        assert re.search(rf"imroute_http_heads_refused_total{{'reason': '{reason}'}} 0", text)
    assert "imroute_http_head_timeouts_total{'sent': 'part'} 0" in text
