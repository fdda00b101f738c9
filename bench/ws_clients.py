"""The client side of bench.ws_endpoints: minimal WebSocket clients on asyncio.Protocol
(handshake, unmasked server frames, pong, close echo), cheap enough that the gateway
side is what the bench measures, and the frames they count."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time

from bench.harness.link import emit, stdin_commands
from bench.harness.stack import HOST, raise_nofile

__all__ = ["SECRET", "client_side", "frame_of"]

SECRET = "bench-secret-0123456789abcdef-0123456789"
FRAME_BYTES = 180
ROUND_TIMEOUT_S = 20.0


def uid_of(k: int) -> str:
    return f"u{k:06d}"


def frame_of(round_no: int) -> bytes:
    """A push frame of exactly FRAME_BYTES bytes whose content names the round."""
    from shared.models import Message
    from shared.wire import encode_push_json, ws_text_frame

    def build(pad: int) -> bytes:
        content = json.dumps({"round": f"{round_no:06d}", "text": "x" * pad}).encode()
        msg = Message("m" * 16, "p" * 16, 1, "bench", content, 1_700_000_000_000)
        return ws_text_frame(encode_push_json(msg))

    # Frames of 126+ payload bytes have a 4-byte header.
    return build(FRAME_BYTES - len(build(0)))


def round_marker(round_no: int) -> bytes:
    return b'"round": "%06d"' % round_no


class Pool:
    """The client connections of one client process and what each got per round."""

    def __init__(self, n: int) -> None:
        self.open = 0
        self.failed = 0
        self.closed = 0
        self.round = -1
        self.marker = b"-"
        self.got = bytearray(n)  # frames of the current round, per connection
        self.count = 0
        self.dups = 0
        self.wrong = 0
        self.last = 0.0
        self.expected = 0
        self.done: asyncio.Future[None] | None = None

    def on_text(self, idx: int, payload: bytes) -> None:
        if self.marker not in payload:
            self.wrong += 1
            return
        seen = self.got[idx]
        self.got[idx] = min(seen + 1, 255)
        if seen:
            self.dups += 1
            return
        self.count += 1
        self.last = time.monotonic()
        if self.count == self.expected and self.done is not None and not self.done.done():
            self.done.set_result(None)


class RawWs(asyncio.Protocol):
    """A minimal WebSocket client: handshake, unmasked server frames, pong, close echo."""

    __slots__ = ("buf", "idx", "opened", "pool", "request", "transport", "upgraded")

    def __init__(self, pool: Pool, idx: int, request: bytes, opened: asyncio.Future[bool]):
        self.pool = pool
        self.idx = idx
        self.request = request
        self.opened: asyncio.Future[bool] | None = opened
        self.buf = b""
        self.upgraded = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(self.request)  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        if not self.upgraded:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.buf = buf
                return
            ok = buf.startswith(b"HTTP/1.1 101 ")
            self.upgraded = ok
            if self.opened is not None and not self.opened.done():
                self.opened.set_result(ok)
            self.opened = None
            if not ok:
                self.transport.close()  # type: ignore[union-attr]
                return
            self.pool.open += 1
            buf = buf[end + 4 :]
        pos, n = 0, len(buf)
        while n - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            size, head = b1 & 0x7F, 2
            if size == 126:
                if n - pos < 4:
                    break
                size, head = int.from_bytes(buf[pos + 2 : pos + 4], "big"), 4
            elif size == 127:
                if n - pos < 10:
                    break
                size, head = int.from_bytes(buf[pos + 2 : pos + 10], "big"), 10
            if n - pos < head + size:
                break
            payload = buf[pos + head : pos + head + size]
            pos += head + size
            opcode = b0 & 0x0F
            if opcode == 0x1:
                self.pool.on_text(self.idx, payload)
            elif opcode == 0x9:  # ping -> pong, masked with a zero key
                self.transport.write(bytes((0x8A, 0x80 | size)) + b"\0\0\0\0" + payload)  # type: ignore[union-attr]
            elif opcode == 0x8:
                self.transport.write(bytes((0x88, 0x80 | size)) + b"\0\0\0\0" + payload)  # type: ignore[union-attr]
                self.transport.close()  # type: ignore[union-attr]
                self.pool.closed += 1
                return
        self.buf = buf[pos:]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.opened is not None and not self.opened.done():
            self.opened.set_result(False)
        if self.upgraded:
            self.pool.open -= 1


async def client_side(port: int, first: int, count: int) -> None:
    from shared.auth import issue_token
    from shared.clock import SystemClock

    raise_nofile(count + 1024)
    loop = asyncio.get_running_loop()
    pool = Pool(count)
    clock = SystemClock()
    emit(event="ready", pid=os.getpid())
    async for msg in stdin_commands():
        cmd, args = msg["cmd"], msg.get("args", [])
        if cmd == "connect":
            t0 = time.monotonic()
            sem = asyncio.Semaphore(int(args[0]))

            async def one(i: int, sem: asyncio.Semaphore) -> None:
                tok = issue_token(SECRET, uid_of(first + i), 3600, clock)
                req = (
                    f"GET /ws?token={tok} HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
                    "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                    "Sec-WebSocket-Version: 13\r\n\r\n"
                ).encode()
                async with sem:
                    opened: asyncio.Future[bool] = loop.create_future()
                    try:
                        await loop.create_connection(
                            lambda: RawWs(pool, i, req, opened), HOST, port
                        )
                        ok = await asyncio.wait_for(opened, 30)
                    except (OSError, TimeoutError):
                        ok = False
                    if not ok:
                        pool.failed += 1

            await asyncio.gather(*(one(i, sem) for i in range(count)))
            emit(event="connected", open=pool.open, failed=pool.failed, s=time.monotonic() - t0)
        elif cmd == "arm":
            pool.round = int(args[0])
            pool.marker = round_marker(pool.round)
            pool.got = bytearray(count)
            pool.count = pool.dups = pool.wrong = 0
            pool.last = 0.0
            pool.expected = pool.open
            pool.done = loop.create_future()
            emit(event="armed")
        elif cmd == "wait":
            assert pool.done is not None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pool.done), ROUND_TIMEOUT_S)
            await asyncio.sleep(0.2)  # time for any duplicate to show up
            emit(
                event="got",
                count=pool.count,
                expected=pool.expected,
                last=pool.last,
                dups=pool.dups,
                wrong=pool.wrong,
            )
        elif cmd == "status":
            emit(event="status", open=pool.open, closed=pool.closed)
        elif cmd == "quit":
            return
