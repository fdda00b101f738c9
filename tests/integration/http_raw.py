"""Raw HTTP/1.1 over asyncio streams, for tests that must control every byte a client
sends (slowloris heads, bodies announced but not sent), and a real push service process."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from router.processes.ports import free_port
from tests.conftest import SECRET
from tests.integration.procs import BIN, Proc, read_until, running, service_env
from tests.waiting import wait_for

HOST = "127.0.0.1"


async def lifespan_done(scope: Scope, receive: Receive, send: Send) -> bool:
    """For a test's ASGI app: see a lifespan scope through to its shutdown (True), or
    leave any other scope to the app (False)."""
    if scope["type"] != "lifespan":
        return False
    while (await receive())["type"] != "lifespan.shutdown":
        pass
    await send({"type": "lifespan.shutdown.complete"})
    return True


@asynccontextmanager
async def uvicorn_on(app: ASGIApp, http: Any, **config: Any) -> AsyncIterator[int]:
    """`app` served in this loop by uvicorn with the protocol class `http`; its port."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host=HOST, port=port, http=http, log_level="warning", lifespan="off", **config
        )
    )
    task = asyncio.create_task(server.serve())
    try:
        await wait_for(lambda: server.started, "uvicorn started")
        yield port
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 5)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        assert self.headers.get("content-type", "").startswith("application/json"), self
        return json.loads(self.body)


async def read_answer(reader: asyncio.StreamReader, timeout: float) -> Answer | None:
    """The next response on the connection; None if it closes without one."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    except asyncio.IncompleteReadError as exc:
        assert exc.partial == b"", exc.partial  # closed, not cut mid-response
        return None
    status, headers = _parse_head(head[:-4])
    length = int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(length), timeout)
    return Answer(status, headers, body)


def read_answer_blocking(sock: socket.socket) -> Answer | None:
    """`read_answer` on a blocking socket (whose timeout bounds each read)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            assert data == b"", data
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, headers = _parse_head(head)
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed mid-response"
        body += chunk
    return Answer(status, headers, body[:length])


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers


async def closed_by_server(reader: asyncio.StreamReader, timeout: float) -> bool:
    """Whether the server closes the connection (EOF or reset) within `timeout`."""
    try:
        rest = await asyncio.wait_for(reader.read(), timeout)
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    assert rest == b"" or rest.startswith(b"HTTP/1.1 "), rest
    return True


def request_head(method: str, path: str, **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {HOST}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


BIND_TRIES = 3


@contextmanager
def push_service(
    redis_url: str, prefix: str, tmp_path: Path, **env: str
) -> Iterator[tuple[Proc, int]]:
    """`python -m push_service` as a real process on a free port, with its own directory.
    A port taken by another socket between `free_port` and the service's bind (the
    suite's other workers open sockets all the time) is tried again with another."""
    for attempt in range(1, BIND_TRIES + 1):
        port = free_port()
        environ = service_env(
            redis_url, prefix, tmp_path, IMROUTE_SECRET=SECRET, IMROUTE_PORT=str(port), **env
        )
        with running([str(BIN / "python"), "-m", "push_service"], environ) as proc:
            try:
                read_until(proc, "Uvicorn running on")
            except AssertionError as exc:
                if "address already in use" in str(exc) and attempt < BIND_TRIES:
                    continue
                raise
            yield proc, port
            return
