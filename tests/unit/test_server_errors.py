"""push_service.errors.ServerErrors on plain ASGI calls: what no handler took is a JSON
500, with `Connection: close` only for a large or chunked body (a small one left unread
the server skips)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from push_service.errors import ServerErrors


def _scope(headers: list[tuple[bytes, bytes]]) -> Scope:
    return {"type": "http", "method": "POST", "path": "/v1/x", "headers": headers}


async def _call(app: Any, headers: list[tuple[bytes, bytes]]) -> list[Message]:
    chunks = [
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"cd", "more_body": False},
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return chunks.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    await ServerErrors(app)(_scope(headers), receive, send)
    return sent


def _reading(parts: int) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        for _ in range(parts):
            await receive()
        raise KeyError("push_id")

    return app


BODY = [(b"content-length", b"4")]


@pytest.mark.parametrize("parts", [0, 1, 2])
async def test_a_500_keeps_the_connection_for_a_small_body_read_or_not(parts: int) -> None:
    start, body = await _call(_reading(parts), BODY)
    assert start["status"] == 500
    assert (b"connection", b"close") not in start["headers"]
    assert (b"content-type", b"application/json") in start["headers"]
    assert json.loads(body["body"])["error"] == "internal_error"


@pytest.mark.parametrize(
    "headers", [[(b"content-length", str(1 << 20).encode())], [(b"transfer-encoding", b"chunked")]]
)
async def test_a_500_closes_the_connection_for_a_large_or_chunked_body(
    headers: list[tuple[bytes, bytes]],
) -> None:
    start, _ = await _call(_reading(0), headers)
    assert (b"connection", b"close") in start["headers"]


async def test_an_error_after_the_answer_began_is_raised_on() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("mid-answer")

    with pytest.raises(RuntimeError, match="mid-answer"):
        await _call(app, [])
