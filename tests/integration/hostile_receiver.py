"""A webhook receiver that misbehaves on purpose: a raw HTTP/1.1 server on 127.0.0.1
(stdlib asyncio) whose answer to each connection is scripted, for the sender's limits.

    async with HostileReceiver(SECRET, [Flood(500), OK]) as rx:
        ...  # the first connection gets a 500 with an endless body, the next ones a 200

Each connection reads one request (its signature checked as `WebhookReceiver` does),
then plays its script's next step (the last one once the script runs out):

- `OK`: 200 with an empty body, keep-alive; its events are collected in `events`.
- `Flood(status)`: `status`, then a close-delimited body of zeros as fast as the socket
  takes it (up to `FLOOD_MAX_BYTES`, far more than a sender should ever read).
- `Drip(head=True)`: the status line one byte every `every_s`, never a whole head;
  `Drip(head=False)`: a whole 200 head, then a chunked body one byte every `every_s`.

Every connection is kept in `conns` with its request's arrival time, when the sender
closed it, and the bytes written to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from router.processes.ports import free_port
from tests.integration.webhook_receiver import check_signature
from tests.waiting import wait_for

__all__ = ["OK", "Conn", "Drip", "Flood", "HostileReceiver"]

FLOOD_MAX_BYTES = 2 << 30
CHUNK = b"\0" * (64 << 10)


@dataclass(frozen=True)
class Flood:
    status: int = 200


@dataclass(frozen=True)
class Drip:
    head: bool = True
    every_s: float = 2.0


@dataclass(frozen=True)
class _Ok:
    pass


OK = _Ok()
Step = Flood | Drip | _Ok


@dataclass
class Conn:
    step: Step
    requested: float = 0.0  # monotonic time its request had arrived
    closed: float | None = None  # when the sender closed it (EOF or reset)
    sent: int = 0  # bytes of answer written
    events: int = 0  # events in its request


@dataclass
class HostileReceiver:
    secret: str
    script: list[Step]
    port: int = field(default_factory=free_port)
    conns: list[Conn] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # OK-answered requests'
    rejected: list[str] = field(default_factory=list)  # bad signatures: a test wants none
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    async def __aenter__(self) -> HostileReceiver:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def wait_for(self, cond: Any, what: str, timeout: float = 20) -> None:
        await wait_for(cond, what, timeout, every=0.02, detail=lambda: str(self.conns))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        step = self.script[min(len(self.conns), len(self.script) - 1)]
        conn = Conn(step)
        self.conns.append(conn)
        while True:
            events = await self._request(reader)
            conn.requested, conn.events = time.monotonic(), len(events)
            if not isinstance(step, _Ok):
                break
            self.events.extend(events)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
        # From here on the sender only closes; its EOF (or reset) ends the answer.
        gone = asyncio.ensure_future(reader.read(1))
        try:
            await self._misbehave(step, writer, conn, gone)
            await gone
        except ConnectionError:
            pass
        finally:
            conn.closed = time.monotonic()
            gone.cancel()

    async def _request(self, reader: asyncio.StreamReader) -> list[dict[str, Any]]:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:])
        }
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        signature = headers.get("x-imroute-signature", "")
        problem = check_signature(self.secret, body, signature, time.time())
        if problem is not None:
            self.rejected.append(problem)
            return []
        events: list[dict[str, Any]] = json.loads(body)["events"]
        return events

    async def _misbehave(
        self, step: Step, writer: asyncio.StreamWriter, conn: Conn, gone: asyncio.Future[bytes]
    ) -> None:
        if isinstance(step, Flood):
            writer.write(f"HTTP/1.1 {step.status} X\r\nConnection: close\r\n\r\n".encode())
            while conn.sent < FLOOD_MAX_BYTES and not gone.done():
                writer.write(CHUNK)
                conn.sent += len(CHUNK)
                await writer.drain()
        elif isinstance(step, Drip):
            if not step.head:
                head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                writer.write(head)
                conn.sent += len(head)
            for byte in _drip(step.head):
                if gone.done():
                    return
                writer.write(byte)
                conn.sent += 1
                await writer.drain()
                await asyncio.wait([gone], timeout=step.every_s)


def _drip(head: bool) -> Iterator[bytes]:
    """An answer's bytes one at a time, for ever: a status line and then header lines
    without end, or a chunked body of one-byte chunks."""
    yield from (bytes([b]) for b in (b"HTTP/1.1 200 OK\r\n" if head else b""))
    line = b"X-Drip: 1\r\n" if head else b"1\r\nx\r\n"
    while True:
        yield from (bytes([b]) for b in line)
