"""One connection's acks on the wire: a task that sends what `AckPacer` lets go, so the
latest pending ack leaves within `interval_s` even while the app sits idle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from websockets.exceptions import ConnectionClosed

from imroute_client.acks import Ack, AckPacer, AckTracker, ack_frame
from imroute_client.stats import ClientStats

__all__ = ["ConnAcks", "Sender"]

log = logging.getLogger("imroute_client")

# How long a close waits to write the last ack before it closes anyway.
FLUSH_TIMEOUT_S = 2.0


class Sender(Protocol):
    """The connection's write side (`websockets`' ClientConnection)."""

    async def send(self, message: str) -> None: ...


class ConnAcks:
    """The acks of connection `conn_id` (the client's count of its connections). With
    `ws` None (a gateway that takes no acks) they are decided, never sent."""

    def __init__(
        self, ws: Sender | None, conn_id: int, interval_s: float, stats: ClientStats
    ) -> None:
        self.conn_id = conn_id
        self.tracker = AckTracker()
        self._ws = ws
        self._pacer = AckPacer(interval_s)
        self._stats = stats
        self._sent = 0  # pushes that acks sent on this connection covered
        self._wake = asyncio.Event()
        self._task = (
            None if ws is None else asyncio.create_task(self._run(), name=f"imroute-acks-{conn_id}")
        )

    @property
    def sent_any(self) -> bool:
        """Whether an ack frame went out on this connection."""
        return self._sent > 0

    def message(self, pos: str | None) -> int:
        """A push handed to the app: its number on this connection."""
        return self.tracker.message(pos)

    def duplicate(self, pos: str | None) -> Ack | None:
        """A push dropped as a duplicate: the ack, if it is acked now (nothing before it
        is held)."""
        return self._offer(self.tracker.duplicate(pos))

    def ack(self, number: int, pos: str | None) -> Ack | None:
        """The app is done with push `number` and every one before it: the ack, if this
        covers something new."""
        return self._offer(self.tracker.ack(number, pos))

    async def close(self, *, flush: bool) -> None:
        """Stop; with `flush`, write the pending ack first (the connection is still
        open). What no ack covered is counted: the server sends it again."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        ack = self._pacer.take()
        if flush and ack is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._send(ack), FLUSH_TIMEOUT_S)
        unacked = self.tracker.received - self._sent
        if unacked:
            self._stats.unacked_at_close += unacked
            log.info("connection %d closed with %d push(es) unacked: the server sends them "
                     "again", self.conn_id, unacked)  # fmt: skip

    def _offer(self, ack: Ack | None) -> Ack | None:
        if ack is not None and self._task is not None and self._pacer.offer(ack):
            self._wake.set()
        return ack

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            ack = self._pacer.poll(loop.time())
            if ack is not None:
                if not await self._send(ack):
                    return
                continue
            due = self._pacer.due()
            self._wake.clear()
            if due is None:
                await self._wake.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(0.0, due - loop.time()))

    async def _send(self, ack: Ack) -> bool:
        """Write one ack frame; False when the connection is gone (its reader sees why)."""
        assert self._ws is not None
        try:
            await self._ws.send(ack_frame(ack.pos))
        except ConnectionClosed:
            return False
        self._sent += ack.count
        self._stats.acks_sent += 1
        self._stats.acked += ack.count
        return True
