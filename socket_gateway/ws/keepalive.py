"""Keepalive without a task per connection: ONE gateway-wide task pings every open
connection every `WsTimers.ping_interval_s`, and closes (1011) those that sent nothing
since the previous ping.

A round is spread over half the interval, in slices of PING_SLICE, and rounds start a
fixed interval apart, so each connection is pinged once per interval at its own moment.
All at once, 5000 connections' pings came back as 5000 pongs in the same instant (and
clients on one machine answered them all at once): a burst on both sides every 30 s,
which stalled pushes on a small machine (docs/benchmarks.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from shared.periodic import Periodic
from socket_gateway.pacing import spread
from socket_gateway.ws.framing import FrameConn
from socket_gateway.ws.protocol import CLOSE_INTERNAL, PING_FRAME

__all__ = ["PING_SLICE", "PING_SPREAD", "KeepaliveConn", "keepalive_loop", "ping_round"]

log = logging.getLogger(__name__)

PING_SLICE = 100  # connections pinged together
PING_SPREAD = 0.5  # a round's slices are spread over this share of the interval


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
    """A round over the connections `live()` returns, starting every `interval_s`."""
    rounds = Periodic(
        "ws keepalive",
        lambda: ping_round(live(), spread_s=interval_s * PING_SPREAD),
        interval_s,
        log=log,
        at_once=False,
        fixed_rate=True,
    )
    await rounds.run()


async def ping_round(conns: Collection[KeepaliveConn], spread_s: float = 0.0) -> None:
    """Ping every open connection; close those silent since the previous round.

    In slices of PING_SLICE connections, `spread_s` apart in all (0: a loop turn
    between slices), so a round over many connections holds neither the loop nor the
    clients for long.
    """
    async for piece in spread(list(conns), PING_SLICE, spread_s):
        for c in piece:
            c._keepalive()
