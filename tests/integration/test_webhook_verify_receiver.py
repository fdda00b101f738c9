"""A receiver built as docs/guides/webhooks.md says (FastAPI under uvicorn, on loopback: `verify`
over the raw body, SignatureError answered 400) answers every malformed signature
header sent to it over a real socket with a 400 naming the problem, never a 500."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from router.processes.ports import free_port
from router.webhook.signing import HEADER, SignatureError, sign, verify
from tests.integration.http_raw import read_answer

pytestmark = pytest.mark.integration

HOST = "127.0.0.1"
SECRET = "whsec-receiver-0123456789"
BODY = b'{"events":[]}'


def receiver() -> FastAPI:
    app = FastAPI()

    @app.post("/hooks")
    async def hooks(request: Request) -> JSONResponse:
        body = await request.body()
        try:
            verify(SECRET, body, request.headers.get(HEADER), time.time())
        except SignatureError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse({"ok": True})

    return app


@pytest.fixture
async def port() -> AsyncIterator[int]:
    port = free_port()
    config = uvicorn.Config(receiver(), host=HOST, port=port, log_level="critical")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            await asyncio.sleep(0.02)
        yield port
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 5)


async def post(port: int, signature: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(
            b"POST /hooks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + HEADER.encode()
            + b": "
            + signature
            + f"\r\nContent-Length: {len(BODY)}\r\n\r\n".encode()
            + BODY
        )
        answer = await read_answer(reader, timeout=5)
        assert answer is not None
        return answer.status, answer.body
    finally:
        writer.close()


async def test_malformed_signature_headers_are_400s_not_500s(port: int) -> None:
    now = int(time.time())
    v1 = sign(SECRET, BODY, now).split(",")[1].encode()
    nasty = [
        b"t=\xb2," + v1,  # "t=²" as a server decodes the byte (latin-1)
        b"t=" + b"9" * 5000 + b"," + v1,
        b"t=\xd9\xa1\xd9\xa8," + v1,  # Arabic-Indic digits, UTF-8
        b"t=" + str(now).encode() + b",t=" + str(now).encode() + b"," + v1,
        b"t=" + str(now).encode() + b",v1=" + b"G" * 64,
        b"t=" + str(now).encode() + b"," + b"x=y," * 400 + v1,
        b"garbage",
    ]
    for header in nasty:
        status, body = await post(port, header)
        assert status == 400, (header[:40], status, body)
        assert b'"error"' in body
    assert await post(port, sign(SECRET, BODY, now).encode()) == (200, b'{"ok":true}')
