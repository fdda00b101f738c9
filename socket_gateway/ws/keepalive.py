"""Keepalive without a task per connection: ONE gateway-wide task pings every open
connection every `WsTimers.ping_interval_s`, and closes (1011) those that sent nothing
since the previous ping.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

from socket_gateway.ws.framing import FrameConn
from socket_gateway.ws.protocol import CLOSE_INTERNAL, PING_FRAME

__all__ = ["PING_SLICE", "KeepaliveConn", "keepalive_loop", "ping_round"]

PING_SLICE = 1000  # connections pinged per loop turn


class KeepaliveConn(FrameConn):
    """The connection layer that answers a keepalive round."""

    __slots__ = ()

    def _keepalive(self) -> None:
        if not self._open:
            return  # opening or closing: a deadline timer is armed
        if not self._alive:
            self.close(CLOSE_INTERNAL, "keepalive ping timeout")
            return
        self._alive = False
        t = self._transport
        if t is not None:
            t.write(PING_FRAME)


async def keepalive_loop(interval_s: float, live: Callable[[], Collection[KeepaliveConn]]) -> None:
    """Every `interval_s`, one round over the connections `live()` returns."""
    while True:
        await asyncio.sleep(interval_s)
        await ping_round(live())


async def ping_round(conns: Collection[KeepaliveConn]) -> None:
    """Ping every open connection; close those silent since the previous round.

    In slices of PING_SLICE connections with a loop turn between them, so a round
    over many connections does not hold the loop (and pushes) for long.
    """
    snapshot = list(conns)
    for start in range(0, len(snapshot), PING_SLICE):
        if start:
            await asyncio.sleep(0)
        for c in snapshot[start : start + PING_SLICE]:
            c._keepalive()
