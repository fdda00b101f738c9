"""Retries that are safe: `imroute push` whose first answer is lost on the way (a proxy
reads the push service's answer and drops the connection) tries again with the same
Idempotency-Key, and the push is delivered once. A real push service process, a real
gateway and WebSocket client, the CLI as a process."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.integration.http_raw import HOST, push_service
from tests.integration.procs import imroute_at
from tests.integration.stack import client, gateway, nothing_more, recv_json

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]


async def _message(reader: asyncio.StreamReader) -> bytes | None:
    """One whole HTTP/1.1 message (head and Content-Length body), as its bytes."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = 0
    for line in head.decode("latin-1").split("\r\n"):
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return head + await reader.readexactly(length)


class AnswerDropper:
    """A proxy to the push service that relays each request and its answer, but for
    the first request drops the answer it got and cuts the connection: the push was
    carried out, and its caller never heard."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.requests: list[bytes] = []
        self.answers: list[bytes] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(HOST, self.upstream)
        try:
            while (request := await _message(reader)) is not None:
                self.requests.append(request)
                up_writer.write(request)
                answer = await _message(up_reader)
                assert answer is not None
                self.answers.append(answer)
                if len(self.requests) == 1:
                    writer.transport.abort()  # reset, not a byte of the answer
                    return
                writer.write(answer)
                await writer.drain()
        finally:
            up_writer.close()
            writer.close()


def _header(message: bytes, name: str) -> str | None:
    for line in message.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == name:
            return value.strip()
    return None


async def test_a_push_whose_answer_was_lost_is_retried_with_its_key_and_delivered_once(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    with push_service(redis_url, prefix, tmp_path) as (_, port):
        dropper = AnswerDropper(port)
        server = await asyncio.start_server(dropper.serve, HOST, 0)
        proxy_port = server.sockets[0].getsockname()[1]
        async with server, gateway(redis_url, prefix, "gw1", "g1") as gw, client(gw, "amy") as amy:
            code, out, err = await imroute_at(proxy_port, "push", "amy", "--content", '{"n":1}')
            assert code == 0, err
            assert "delivered 1 (amy)" in out, out
            # The first try was carried out: amy has it, once, though its answer was lost.
            assert (await recv_json(amy))["content"] == {"n": 1}
            assert await nothing_more(amy, 1.0)
    assert len(dropper.requests) == 2, dropper.requests
    keys = {_header(r, "idempotency-key") for r in dropper.requests}
    assert len(keys) == 1 and next(iter(keys), "").startswith("imroute-cli-"), keys
    first, second = (json.loads(a.split(b"\r\n\r\n", 1)[1]) for a in dropper.answers)
    assert first["push_id"] == second["push_id"]  # the first answer, replayed
    assert _header(dropper.answers[1], "idempotent-replayed") == "true"
