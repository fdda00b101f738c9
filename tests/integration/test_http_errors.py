"""Every error of the push service is JSON, a 500 included, and a 500 keeps its
keep-alive connection clean: against a real `python -m push_service`, over raw sockets."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import uvicorn
from starlette.types import Receive, Scope, Send

from push_service.errors import ServerErrors
from push_service.http_server import Parser, head_deadline_protocol
from router.processes.ports import free_port
from shared.keys import KeySchema
from tests.conftest import API_KEY
from tests.integration.http_raw import (
    HOST,
    closed_by_server,
    push_service,
    read_answer,
    request_head,
)
from tests.integration.procs import read_until
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

AUTH = f"Bearer {API_KEY}"


async def test_a_500_is_json_naming_its_logged_id_and_the_connection_goes_on(
    redis_url: str, prefix: str, redis: aioredis.Redis, tmp_path: Path
) -> None:
    # A job record that is not one (a bug's or an operator's write): reading it raises.
    await redis.hset(KeySchema(prefix).job("broken"), mapping={"x": "y"})
    with push_service(redis_url, prefix, tmp_path) as (proc, port):
        reader, writer = await asyncio.open_connection(HOST, port)
        # The 500 and, pipelined behind it on the same connection, a health check.
        writer.write(
            request_head("GET", "/v1/pushes/broken", Authorization=AUTH)
            + request_head("GET", "/healthz")
        )
        failed = await read_answer(reader, timeout=10)
        assert failed is not None and failed.status == 500, failed
        body = failed.json()
        assert body["error"] == "internal_error", body
        match = re.search(r"logged as ([0-9a-f]{12})", body["detail"])
        assert match, body
        assert "Idempotency-Key" in body["detail"]
        assert failed.headers.get("connection") != "close"
        healthy = await read_answer(reader, timeout=10)
        assert healthy is not None and healthy.status == 200, healthy
        assert not await closed_by_server(reader, 0.5)  # kept, as it said
        writer.write(request_head("GET", "/healthz"))
        again = await read_answer(reader, timeout=10)
        assert again is not None and again.status == 200
        writer.close()
        # The log names the id, with the traceback.
        logged = read_until(proc, f"unhandled error {match.group(1)} on GET /v1/pushes/broken")
        assert logged


@pytest.mark.usefixtures("redis")
async def test_a_websocket_upgrade_is_answered_as_plain_http_in_json(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    # uvicorn's WebSocket layer answered these with a text/plain 400; the push service
    # serves no WebSocket.
    with push_service(redis_url, prefix, tmp_path) as (_, port):
        for path, status, error in [
            ("/healthz", 200, None),
            ("/nope", 404, "not_found"),
            ("/dashboard/x.js", 404, "not_found"),
        ]:
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(request_head("GET", path, Upgrade="websocket", Connection="Upgrade"))
            answer = await read_answer(reader, timeout=10)
            assert answer is not None and answer.status == status, (path, answer)
            if error is None:
                assert answer.json() == {"status": "ok"}
            else:
                assert answer.json()["error"] == error
            writer.close()


async def _fails_unread(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/fail":
        raise KeyError("before the body was read")
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize("parser", ["h11", "httptools"])
async def test_a_500_before_a_small_body_was_read_keeps_the_connection_clean(
    parser: Parser,
) -> None:
    # Each of uvicorn's parsers skips the body a handler left unread once the answer is
    # out, and reads the next request: so a 500 needs no Connection: close for it.
    port = free_port()
    config = uvicorn.Config(
        ServerErrors(_fails_unread),
        host=HOST,
        port=port,
        http=head_deadline_protocol(5.0, parser),
        log_level="critical",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        await wait_for(lambda: server.started, "uvicorn started")
        reader, writer = await asyncio.open_connection(HOST, port)
        body = b'{"to":["x"]}'
        writer.write(
            request_head("POST", "/fail", Content_Length=str(len(body)))
            + body
            + request_head("GET", "/next")
        )
        failed = await read_answer(reader, timeout=5)
        assert failed is not None and failed.status == 500
        assert failed.json()["error"] == "internal_error"
        assert failed.headers.get("connection") != "close"
        after = await read_answer(reader, timeout=5)
        assert after is not None and (after.status, after.body) == (200, b"ok")
        writer.close()
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 5)
