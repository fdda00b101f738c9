"""Silent sockets from one loopback address (all of 127/8 is loopback: the source is
bound), the way a stranger holds a server's sockets open: they connect, never send a
byte and ignore what they are told; one the server closes is opened again. Bounded in
count, connects and time; used against real gateway processes (test_preauth_flood.py,
test_delivery_link_flood.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

__all__ = ["Flood", "flood"]


class _Silent(asyncio.Protocol):
    def __init__(self, flood: Flood) -> None:
        self._flood = flood
        self.opened = time.monotonic()
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self._flood.live.add(self)

    def data_received(self, data: bytes) -> None:
        self._flood.answered += 1  # e.g. a 429 written at once: ignored

    # The server's FIN (its close, or an abort: asyncio's abort sends a FIN when nothing
    # is unread) ends it here too, so that it is opened again.

    def connection_lost(self, exc: Exception | None) -> None:
        flood = self._flood
        flood.live.discard(self)
        flood.held_s.append(time.monotonic() - self.opened)
        flood.lost.set()


@dataclass
class Flood:
    """`size` silent sockets from `source` to `port`; with `reopen_s`, each one the
    server closes is opened again that much later, until `max_connects`."""

    port: int
    source: str
    size: int
    reopen_s: float | None = None
    max_connects: int = 20_000
    connects: int = 0
    failed: int = 0  # connects refused or reset before they were accepted
    answered: int = 0
    live: set[_Silent] = field(default_factory=set)
    held_s: list[float] = field(default_factory=list)  # how long each closed one was open
    lost: asyncio.Event = field(default_factory=asyncio.Event)

    async def open_one(self) -> None:
        loop = asyncio.get_running_loop()
        self.connects += 1
        try:
            await loop.create_connection(
                lambda: _Silent(self), "127.0.0.1", self.port, local_addr=(self.source, 0)
            )
        except OSError:
            self.failed += 1

    async def fill(self) -> None:
        """Open `size` sockets, 250 connects at a time."""
        for start in range(0, self.size, 250):
            await asyncio.gather(*(self.open_one() for _ in range(min(250, self.size - start))))

    async def keep_full(self) -> None:
        """Open again what the server closed, `reopen_s` after, while connects are left."""
        assert self.reopen_s is not None
        while self.connects < self.max_connects:
            await asyncio.sleep(self.reopen_s)
            missing = min(self.size - len(self.live), self.max_connects - self.connects)
            if missing > 0:
                await asyncio.gather(*(self.open_one() for _ in range(missing)))

    def close(self) -> None:
        for silent in list(self.live):
            if silent.transport is not None:
                silent.transport.abort()


@asynccontextmanager
async def flood(
    port: int, source: str, size: int, reopen_s: float | None = None
) -> AsyncIterator[Flood]:
    """A flood opened (and, with `reopen_s`, kept full) for the body; closed after."""
    f = Flood(port, source, size, reopen_s)
    await f.fill()
    keeper = asyncio.create_task(f.keep_full()) if reopen_s is not None else None
    try:
        yield f
    finally:
        if keeper is not None:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        f.close()
