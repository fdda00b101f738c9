"""Hostile WebSocket clients for tests/integration/test_ws_fuzz.py, run as a process of
their own so that their loop does not share a core's time with the measured client:

    python -m tests.integration.ws_fuzz_attacks --port P --seconds S --seed N

Several asyncio tasks on raw sockets throw at one gateway, until the time is up:
random frames, fragments, oversized frames, control frames, invalid UTF-8, slowloris
heads (a few bytes a second), half-closed sockets, and floods of connects and of
frames. Nothing the gateway answers is checked here (a refused handshake may be a 101
then a close, or an HTTP error): the test checks that the gateway survives. The last
line printed is a JSON object of what was done.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import socket
import struct
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from shared.auth import issue_token
from shared.clock import SystemClock
from tests.conftest import SECRET

__all__ = ["ATTACKS", "main"]

HOST = "127.0.0.1"
# Network errors are the expected answer to most of what is sent here.
EXPECTED = (OSError, asyncio.IncompleteReadError, TimeoutError, EOFError)


@dataclass
class Fuzz:
    port: int
    deadline: float
    rng: random.Random
    done: Counter[str] = field(default_factory=Counter)
    tokens: list[str] = field(default_factory=list)

    def live(self) -> bool:
        return time.monotonic() < self.deadline

    def token(self) -> str:
        # 30 uids: their sockets also run into the per-user cap
        return self.rng.choice(self.tokens)


def head(fz: Fuzz, token: str | None = None, path: str = "/ws", extra: str = "") -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    query = f"?token={token if token is not None else fz.token()}"
    return (
        f"GET {path}{query} HTTP/1.1\r\nHost: {HOST}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        f"Sec-WebSocket-Version: 13\r\n{extra}\r\n"
    ).encode()


def frame(
    opcode: int,
    payload: bytes,
    *,
    fin: bool = True,
    rsv: int = 0,
    masked: bool = True,
    length: int | None = None,
) -> bytes:
    """One frame, possibly malformed: any opcode and RSV bits, unmasked, a lying length."""
    n = len(payload) if length is None else length
    out = bytearray([(0x80 if fin else 0) | (rsv & 0x7) << 4 | (opcode & 0xF)])
    bit = 0x80 if masked else 0
    if n < 126:
        out.append(bit | n)
    elif n < 1 << 16:
        out += struct.pack("!BH", bit | 126, n)
    else:
        out += struct.pack("!BQ", bit | 127, n & ((1 << 64) - 1))
    if masked:
        mask = os.urandom(4)
        out += mask
        out += bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    else:
        out += payload
    return bytes(out)


PING_TEXT = frame(0x1, b'{"type":"ping"}')


async def opened(
    fz: Fuzz, token: str | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection that sent a WebSocket upgrade and read the answer's head."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, fz.port), 3)
    writer.write(head(fz, token))
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
    fz.done["upgrades"] += 1
    return reader, writer


async def drain(reader: asyncio.StreamReader, seconds: float) -> None:
    """Read whatever comes for `seconds` (or to EOF)."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        try:
            if not await asyncio.wait_for(reader.read(65536), left):
                return
        except TimeoutError:
            return


def end(writer: asyncio.StreamWriter, rng: random.Random) -> None:
    """Leave abruptly (RST) or politely (FIN)."""
    if rng.random() < 0.5:
        writer.transport.abort()
    else:
        writer.close()


@asynccontextmanager
async def connection(fz: Fuzz) -> AsyncIterator[asyncio.StreamWriter]:
    """An upgraded connection to write an attack on; then what comes back is read for
    0.1 s, and the connection is left (`end`)."""
    reader, writer = await opened(fz)
    yield writer
    await drain(reader, 0.1)
    end(writer, fz.rng)


# --------------------------------------------------------------------------- attacks


async def random_frames(fz: Fuzz) -> None:
    rng = fz.rng
    async with connection(fz) as writer:
        for _ in range(rng.randint(1, 20)):
            payload = rng.randbytes(rng.choice([0, 1, 5, 125, 126, 300, 4000]))
            writer.write(
                frame(
                    rng.randrange(16),
                    payload,
                    fin=rng.random() < 0.8,
                    rsv=rng.randrange(8) if rng.random() < 0.2 else 0,
                    masked=rng.random() < 0.9,
                    length=rng.choice([None, None, None, 0, 2, 70_000, 1 << 40]),
                )
            )
            fz.done["frames"] += 1
        if rng.random() < 0.2:
            writer.write(rng.randbytes(rng.randint(1, 2000)))  # not even frames


async def fragments(fz: Fuzz) -> None:
    rng = fz.rng
    async with connection(fz) as writer:
        kind = rng.randrange(4)
        if kind == 0:  # a message in many pieces, pings between them, past 4096 bytes in all
            writer.write(frame(0x1, b'{"type":', fin=False))
            for _ in range(rng.randint(1, 300)):
                writer.write(frame(0x0, rng.randbytes(rng.randint(0, 40)), fin=False))
                if rng.random() < 0.3:
                    writer.write(frame(0x9, b"between"))
            writer.write(frame(0x0, b'"ping"}'))
        elif kind == 1:  # a continuation with no start
            writer.write(frame(0x0, b"orphan"))
        elif kind == 2:  # a new message before the last one ended
            writer.write(frame(0x1, b"one", fin=False) + frame(0x1, b"two", fin=False))
        else:  # a valid fragmented ping
            writer.write(frame(0x1, b'{"type"', fin=False) + frame(0x0, b':"ping"}'))
        fz.done["fragments"] += 1


async def oversized(fz: Fuzz) -> None:
    rng = fz.rng
    async with connection(fz) as writer:
        kind = rng.randrange(3)
        if kind == 0:  # announce 1 MiB, send 256 KiB of it
            writer.write(frame(0x1, b"", length=1 << 20))
            writer.write(os.urandom(256 * 1024))
        elif kind == 1:  # the largest length the header can say
            writer.write(frame(0x2, b"", length=(1 << 63) - 1))
        else:  # a whole 200 KiB message, unfragmented
            writer.write(frame(0x1, b"x" * 200_000))
        fz.done["oversized"] += 1


async def control_frames(fz: Fuzz) -> None:
    """Control frames, valid and not, and invalid UTF-8."""
    rng = fz.rng
    async with connection(fz) as writer:
        choices = [
            frame(0x9, rng.randbytes(125)),  # the largest ping
            frame(0x9, rng.randbytes(126)),  # over the control-frame limit
            frame(0x9, b"frag", fin=False),  # a fragmented control frame
            frame(0xA, b"unasked"),  # a pong nobody asked for
            frame(0x8, struct.pack("!H", 999)),  # an invalid close code
            frame(0x8, struct.pack("!H", 1005)),  # a code that must not be sent
            frame(0x8, struct.pack("!H", 1000) + b"\xff\xfe"),  # a reason that is not UTF-8
            frame(0x8, b"\x03"),  # a one-byte close payload
            frame(0x8, b""),
            # text that is not UTF-8, whole or split inside a character
            frame(
                0x1, rng.choice([b"\xff\xfe", b"\xed\xa0\x80", b'{"a":"\xe2\x82"}', b"\xc0\xaf"])
            ),
            frame(0x1, b'{"a":"\xe2', fin=False) + frame(0x0, b'\x28\xa1"}'),
        ]
        for _ in range(rng.randint(1, 5)):
            writer.write(rng.choice(choices))
        fz.done["control"] += 1


async def slowloris(fz: Fuzz) -> None:
    """A few bytes a second: of a request head, or of a frame after the 101."""
    rng = fz.rng
    if rng.random() < 0.7:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, fz.port), 3)
        data = head(fz)
    else:
        reader, writer = await opened(fz)
        data = PING_TEXT * 3
    fz.done["slowloris"] += 1
    try:
        for i in range(0, len(data), 2):
            if not fz.live() or reader.at_eof():
                break
            writer.write(data[i : i + 2])
            await writer.drain()
            await asyncio.sleep(0.5)
    finally:
        writer.transport.abort()


async def half_closed(fz: Fuzz) -> None:
    """Write something, then shutdown(SHUT_WR), and keep reading."""
    rng = fz.rng
    reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, fz.port), 3)
    data = head(fz)
    kind = rng.randrange(3)
    if kind == 0:
        data = data[: rng.randint(1, len(data) - 1)]  # half a head
    elif kind == 2:
        data += PING_TEXT  # a whole head and a frame
    writer.write(data)
    await writer.drain()
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.shutdown(socket.SHUT_WR)
    fz.done["half_closed"] += 1
    try:
        await drain(reader, 1.0)
    finally:
        writer.transport.abort()


async def connect_flood(fz: Fuzz) -> None:
    rng = fz.rng
    reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, fz.port), 3)
    kind = rng.randrange(5)
    if kind == 1:
        writer.write(rng.randbytes(rng.randint(1, 600)))
    elif kind == 2:
        writer.write(head(fz, token="not-a-token"))
    elif kind == 3:
        writer.write(head(fz))
    elif kind == 4:  # junk HTTP: bad version, huge headers, other paths
        writer.write(
            rng.choice(
                [
                    b"GET /ws HTTP/0.9\r\n\r\n",
                    head(fz, extra="X-Junk: " + "a" * 20_000 + "\r\n"),
                    head(fz, path="/nowhere"),
                    b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
                    b"POST /ws HTTP/1.1\r\nContent-Length: 99999\r\n\r\n" + b"z" * 1000,
                    head(fz).replace(b"Version: 13", b"Version: 8"),
                ]
            )
        )
    fz.done["connects"] += 1
    if kind and rng.random() < 0.5:
        await drain(reader, 0.05)
    end(writer, rng)


async def frame_flood(fz: Fuzz) -> None:
    """A valid client that sends as fast as it can: pings, text pings, both."""
    rng = fz.rng
    reader, writer = await opened(fz)
    burst = rng.choice([frame(0x9, b"p"), PING_TEXT, frame(0xA, b"")]) * 2000
    for _ in range(20):
        if reader.at_eof() or writer.is_closing():
            break
        writer.write(burst)
        fz.done["flood_frames"] += 2000
        await writer.drain()
        await asyncio.sleep(0.01)
    await drain(reader, 0.05)
    end(writer, rng)


Attack = Callable[[Fuzz], Awaitable[None]]

# attack -> how many tasks run it at once
ATTACKS: dict[Attack, int] = {
    random_frames: 3,
    fragments: 2,
    oversized: 2,
    control_frames: 3,
    slowloris: 40,
    half_closed: 4,
    connect_flood: 12,
    frame_flood: 2,
}


async def _loop(fz: Fuzz, attack: Attack) -> None:
    while fz.live():
        started = time.monotonic()
        try:
            await attack(fz)
        except EXPECTED as exc:
            fz.done["network_errors"] += 1
            fz.done[f"err.{attack.__name__}.{type(exc).__name__}"] += 1
        fz.done[f"ms.{attack.__name__}"] += int((time.monotonic() - started) * 1000)
        fz.done[f"runs.{attack.__name__}"] += 1
        await asyncio.sleep(fz.rng.uniform(0, 0.01))


async def run(port: int, seconds: float, seed: int) -> Counter[str]:
    fz = Fuzz(port, time.monotonic() + seconds, random.Random(seed))
    clock = SystemClock()
    fz.tokens = [issue_token(SECRET, f"fuzz-{i}", 3600, clock) for i in range(30)]
    tasks = [
        asyncio.create_task(_loop(fz, attack))
        for attack, count in ATTACKS.items()
        for _ in range(count)
    ]
    await asyncio.gather(*tasks)
    return fz.done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print("fuzz started", flush=True)
    done = asyncio.run(run(args.port, args.seconds, args.seed))
    print("fuzz done " + json.dumps(dict(sorted(done.items()))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
