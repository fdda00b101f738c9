"""uvicorn as the push service runs it (push_service.http_server): a deadline for each
request head, the keep-alive timeout and the concurrency limit, against a real
`python -m push_service` and, for each of uvicorn's HTTP parsers, an in-process server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from starlette.types import Receive, Scope, Send

from push_service.http_server import Parser, head_deadline_protocol
from router.processes.ports import free_port
from tests.integration import http_raw
from tests.integration.http_raw import (
    HOST,
    closed_by_server,
    lifespan_done,
    push_service,
    read_answer,
    request_head,
    uvicorn_on,
)
from tests.integration.procs import read_until

pytestmark = pytest.mark.integration


async def _drip_head(writer: asyncio.StreamWriter, every_s: float) -> None:
    """A slowloris head: one header line at a time, never the blank line that ends it."""
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    with contextlib.suppress(ConnectionError):
        for n in range(1000):
            await asyncio.sleep(every_s)
            writer.write(f"X-Drip-{n}: y\r\n".encode())
            await writer.drain()


async def _slowloris_is_cut(port: int, timeout_s: float, read_late: bool = False) -> None:
    """A head dripped every quarter of the timeout is answered 408 and the connection
    closed. `read_late`: the client drips every 40 ms (25 fields a second: far from the
    100 a head may have, which would be a 431) and reads only half a second after
    the answer went, its drip going on into the connection meanwhile (so the server must
    read and drop it, not reset the connection under the unread answer)."""
    reader, writer = await asyncio.open_connection(HOST, port)
    drip = asyncio.create_task(_drip_head(writer, every_s=0.04 if read_late else timeout_s / 4))
    if read_late:
        await asyncio.sleep(timeout_s + 0.5)
    try:
        answer = await read_answer(reader, timeout=timeout_s + 3)
        assert answer is not None and answer.status == 408, answer
        assert answer.json()["error"] == "request_timeout"
        assert "IMROUTE_HTTP_HEADER_TIMEOUT_S" in answer.json()["detail"]
        assert await closed_by_server(reader, 2)
    finally:
        drip.cancel()
        writer.close()


@pytest.mark.usefixtures("redis")
async def test_slowloris_heads_are_cut_by_the_header_timeout(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """Left alone, uvicorn holds a head that never ends for ever. The real process, with
    IMROUTE_HTTP_HEADER_TIMEOUT_S=1."""
    env = {"IMROUTE_HTTP_HEADER_TIMEOUT_S": "1", "IMROUTE_HTTP_KEEPALIVE_TIMEOUT_S": "3"}
    with push_service(redis_url, prefix, tmp_path, **env) as (proc, port):
        await _slowloris_is_cut(port, 1.0)
        # Counted in a log line (at most one every 10 s, with the count since).
        read_until(proc, "closed 1 connection(s) with a request head not whole after 1s", 5)
        # A client still sending when the answer goes, and reading it late, reads it
        # whole, then the close (closed at once, the server reset the connection under it).
        await _slowloris_is_cut(port, 1.0, read_late=True)
        # A connection that sends nothing at all is closed, without a word.
        reader, writer = await asyncio.open_connection(HOST, port)
        assert await closed_by_server(reader, 4)
        assert reader.at_eof()
        writer.close()
        # A well-behaved client on a keep-alive connection: its idle time between
        # requests is the keep-alive timeout's (3 s), not the head's (1 s)...
        reader, writer = await asyncio.open_connection(HOST, port)
        for _ in range(2):
            writer.write(request_head("GET", "/healthz"))
            answer = await read_answer(reader, timeout=5)
            assert answer is not None and answer.status == 200
            assert not await closed_by_server(reader, 1.5)
        # ...and a slow head on that connection is cut like a first one.
        drip = asyncio.create_task(_drip_head(writer, every_s=0.25))
        answer = await read_answer(reader, timeout=4)
        assert answer is not None and answer.status == 408
        drip.cancel()
        writer.close()
        # Idle past the keep-alive timeout: closed.
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.write(request_head("GET", "/healthz"))
        assert (await read_answer(reader, timeout=5)) is not None
        assert await closed_by_server(reader, 6)
        writer.close()


async def _hello(scope: Scope, receive: Receive, send: Send) -> None:
    if await lifespan_done(scope, receive, send):
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def _uvicorn(parser: Parser, header_timeout_s: float) -> AbstractAsyncContextManager[int]:
    return uvicorn_on(_hello, head_deadline_protocol(header_timeout_s, parser))


@pytest.mark.parametrize("parser", ["h11", "httptools"])
async def test_both_parsers_cut_slow_heads_and_answer_bad_ones_in_json(parser: Parser) -> None:
    async with _uvicorn(parser, 0.5) as port:
        await _slowloris_is_cut(port, 0.5)
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        answer = await read_answer(reader, timeout=3)
        assert answer is not None and answer.status == 400
        assert answer.json()["error"] == "bad_request"
        writer.close()
        # A request that arrives in pieces, each well within the deadline, is served.
        reader, writer = await asyncio.open_connection(HOST, port)
        for piece in (b"GET / HTTP/1.1\r\n", b"Host: x\r\n", b"\r\n"):
            writer.write(piece)
            await asyncio.sleep(0.1)
        answer = await read_answer(reader, timeout=3)
        assert answer is not None and answer.status == 200
        writer.close()


async def _sized(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers with its path as the body, with a Content-Length, once the request's body
    is read."""
    if await lifespan_done(scope, receive, send):
        return
    while True:  # the request's body read whole first; a disconnect gets no answer
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        if not message.get("more_body"):
            break
    body = scope["path"].encode()
    if body == b"/slow":  # answered a loop turn or more after the request came whole
        await asyncio.sleep(0.05)
    length = (b"content-length", str(len(body)).encode())
    await send({"type": "http.response.start", "status": 200, "headers": [length]})
    await send({"type": "http.response.body", "body": body})


@pytest.mark.parametrize("parser", ["h11", "httptools"])
async def test_answers_held_for_one_send_arrive_whole_and_in_order(parser: Parser) -> None:
    """An answer's head and body leave in one send at the end of the loop turn: pipelined
    requests get their answers in order, a client that half-closes after its request
    still gets its answer (whenever it comes), and `Connection: close` gets the answer
    before the close."""
    async with uvicorn_on(_sized, head_deadline_protocol(5, parser)) as port:
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.write(b"".join(request_head("GET", f"/{p}") for p in "abc"))
        for path in (b"/a", b"/b", b"/c"):
            answer = await read_answer(reader, timeout=3)
            assert answer is not None and answer.body == path
        writer.close()
        for path in ("/half", "/slow"):  # a half-close: answered, then closed
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(request_head("GET", path))
            writer.write_eof()
            answer = await read_answer(reader, timeout=3)
            assert answer is not None and answer.body == path.encode()
            assert await closed_by_server(reader, 3)
            writer.close()
        # A body that stops short at the half-close: closed, no answer.
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.write(request_head("POST", "/cut", Content_Length="10") + b"12345")
        writer.write_eof()
        assert await read_answer(reader, timeout=3) is None
        writer.close()
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.write(request_head("GET", "/last", Connection="close"))
        answer = await read_answer(reader, timeout=3)
        assert answer is not None and answer.body == b"/last"
        assert await closed_by_server(reader, 3)
        writer.close()


@pytest.mark.usefixtures("redis")
async def test_past_the_concurrency_limit_uvicorn_answers_503(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    env = {"IMROUTE_HTTP_MAX_CONCURRENCY": "4"}
    with push_service(redis_url, prefix, tmp_path, **env) as (_, port):
        conns = []
        statuses = []
        for _ in range(6):  # one after the other, each kept open (keep-alive)
            reader, writer = await asyncio.open_connection(HOST, port)
            conns.append(writer)
            writer.write(request_head("GET", "/healthz"))
            answer = await read_answer(reader, timeout=5)
            assert answer is not None
            statuses.append(answer.status)
        # uvicorn counts the asking connection: with 3 open, the 4th is at the limit.
        assert statuses == [200, 200, 200, 503, 503, 503], statuses
        # ...and its 503 is JSON, as every error is (uvicorn's own is text/plain)
        assert answer.json()["error"] == "overloaded", answer
        assert "IMROUTE_HTTP_MAX_CONCURRENCY" in answer.json()["detail"]
        assert answer.headers["retry-after"] == "1"
        for writer in conns:
            writer.close()
        await asyncio.sleep(0.3)
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.write(request_head("GET", "/healthz"))
        answer = await read_answer(reader, timeout=5)
        assert answer is not None and answer.status == 200
        assert json.loads(answer.body) == {"status": "ok"}
        writer.close()


def test_a_port_taken_before_the_bind_is_tried_again_with_another(
    redis_url: str, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test helper's answer to a race of the suite's own: another socket took the
    free port before the push service bound it."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        ports = iter([busy, free_port()])
        monkeypatch.setattr(http_raw, "free_port", lambda: next(ports))
        with http_raw.push_service(redis_url, prefix, tmp_path) as (_, port):
            assert port != busy
