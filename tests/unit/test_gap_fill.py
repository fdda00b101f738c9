"""A hole in a live connection's P2P sequence that cannot be read is not passed over."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from router.recovery.base import UserHistory
from shared.clock import SystemClock
from shared.errors import RegistryUnavailable
from socket_gateway.connections import ClientConn, LocalConnections
from socket_gateway.gap_fill import GapFills
from socket_gateway.ws.protocol import CLOSE_TRY_AGAIN


@dataclass
class ClosingSink:
    frames: list[bytes] = field(default_factory=list)
    closed: tuple[int, str] | None = None

    def is_open(self) -> bool:
        return self.closed is None

    def buffered(self) -> int:
        return 0

    def write(self, data: bytes) -> None:
        self.frames.append(data)

    def abort(self) -> None:
        self.closed = (1006, "")

    def close(self, code: int, reason: str = "") -> None:
        self.closed = (code, reason)


async def test_an_unreadable_hole_closes_the_connection_to_be_resumed_from_its_position() -> None:
    """Passed over, the connection's next ack would cover the hole, which it was never
    written: the user's inbox would lose it."""
    conns = LocalConnections()
    sink = ClosingSink()
    conn = ClientConn("amy", "c1", sink)
    conns.add(conn)
    conn.p = 3

    async def unreadable(_: tuple[str, int | None]) -> UserHistory:
        raise RegistryUnavailable("redis down")

    work: list[asyncio.Future[None]] = []

    def spawn(job: Coroutine[Any, Any, None]) -> None:
        work.append(asyncio.ensure_future(job))

    fills = GapFills(unreadable, conns, SystemClock(), None, spawn)
    fills.fill(conn, 3, 7)
    await asyncio.gather(*work)
    assert sink.closed is not None and sink.closed[0] == CLOSE_TRY_AGAIN
    assert conn.p == 3 and conn.held is None and sink.frames == []
