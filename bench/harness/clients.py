"""WebSocket clients of a client process (the `websockets` asyncio client), one task each."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection
    from websockets.protocol import Event

__all__ = [
    "CONNECT_PARALLEL",
    "ClientPool",
    "ack_frame",
    "indices_of",
    "send_now",
    "spec_pool",
    "token_url",
    "uid_of",
]

TOKEN_TTL_S = 3600
CONNECT_PARALLEL = 64  # WebSocket handshakes in flight per client process

OnFrame = Callable[["ClientConnection", float, bytes], None]


def uid_of(k: int) -> str:
    return f"u{k}"


def ack_frame(pos: str) -> bytes:
    """The frame a client sends once it is done with the push that carried `pos`."""
    return json.dumps({"type": "ack", "pos": pos}, separators=(",", ":")).encode()


def send_now(conn: ClientConnection, text: bytes) -> bool:
    """Write a text frame from a frame callback (`on_frame`), without a task: the frame
    goes to the transport at once, as `await conn.send(...)` would put it there. False
    when the connection is closing (the frame is not sent)."""
    from websockets.exceptions import InvalidState

    try:
        conn.protocol.send_text(text)
    except InvalidState:
        return False
    conn.send_data()
    return True


def indices_of(spec: dict[str, Any]) -> range:
    """A client process's client numbers, passed as [start, stop, step] (argv stays short)."""
    start, stop, step = spec["indices"]
    return range(start, stop, step)


def token_url(base: str, k: int, secret: str) -> str:
    from shared.auth import issue_token
    from shared.clock import SystemClock

    return f"{base}?token={issue_token(secret, uid_of(k), TOKEN_TTL_S, SystemClock())}"


def spec_pool(
    spec: dict[str, Any], on_frame: OnFrame, parallel: int = CONNECT_PARALLEL
) -> ClientPool:
    """A worker's pool: the clients numbered by spec["indices"], client k on the gateway
    spec["urls"][k % len(urls)] with a token signed by IMROUTE_SECRET."""
    urls: list[str] = spec["urls"]
    secret = os.environ["IMROUTE_SECRET"]
    return ClientPool(
        indices_of(spec), lambda k: token_url(urls[k % len(urls)], k, secret), on_frame, parallel
    )


class ClientPool:
    """Each client is one task: connect, then wait until the connection ends.

    Push frames are handed to `on_frame(connection, arrival, payload)` as the connection
    parses them (through the client's `create_connection` hook) instead of through
    `recv()`: that skips one task wake-up per frame, which matters when a few client
    processes share two cores with the servers they measure. A client the gateway closes
    with 1013 (try again later, sent when the route registry did not answer) reconnects
    after a short random pause, as a real client would. `owner` maps each open
    connection to its client number.
    """

    def __init__(
        self,
        indices: Sequence[int],
        url_of: Callable[[int], str],
        on_frame: OnFrame,
        parallel: int = CONNECT_PARALLEL,
    ) -> None:
        self._indices = list(indices)
        self._url_of = url_of
        self._gate = asyncio.Semaphore(parallel)  # handshakes in flight
        self._pending = len(self._indices)
        self._settled = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.failed: list[int] = []
        self.open = 0
        self.owner: dict[ClientConnection, int] = {}
        self.stats = {"try_again": 0, "closed": 0, "connect_errors": 0}
        self._connection_type = _frame_callback_connection(on_frame)

    async def start(self) -> list[int]:
        """Start every client; return when each has connected once or given up."""
        if not self._indices:
            return []
        self._tasks = [asyncio.create_task(self._client(k)) for k in self._indices]
        await self._settled.wait()
        return self.failed

    def _first_outcome(self) -> None:
        self._pending -= 1
        if self._pending == 0:
            self._settled.set()

    async def _client(self, k: int) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import WebSocketException

        url = self._url_of(k)
        first = True
        errors = 0
        while True:
            async with self._gate:
                try:
                    ws = await connect(
                        url,
                        compression=None,
                        ping_interval=None,
                        proxy=None,
                        open_timeout=30,
                        close_timeout=1,
                        max_queue=None,
                        create_connection=self._connection_type,
                    )
                except (OSError, TimeoutError, WebSocketException):
                    ws = None
            if ws is None:
                errors += 1
                self.stats["connect_errors"] += 1
                if errors >= 5:
                    self.failed.append(k)
                    if first:
                        self._first_outcome()
                    return
                await asyncio.sleep(0.2 * errors)
                continue
            self.owner[ws] = k
            self.open += 1
            if first:
                first = False
                self._first_outcome()
            await ws.wait_closed()
            self.open -= 1
            del self.owner[ws]
            if ws.close_code == 1013:  # CLOSE_TRY_AGAIN
                self.stats["try_again"] += 1
                await asyncio.sleep(0.2 + random.random())
                continue
            self.stats["closed"] += 1
            return

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()


def _frame_callback_connection(on_frame: OnFrame) -> type[ClientConnection]:
    """A ClientConnection that passes each whole text frame to `on_frame`."""
    from websockets.asyncio.client import ClientConnection
    from websockets.frames import Frame, Opcode

    monotonic = time.monotonic

    class FrameCallbackConnection(ClientConnection):
        def process_event(self, event: Event) -> None:
            if (
                self.response is not None
                and isinstance(event, Frame)
                and event.opcode is Opcode.TEXT
                and event.fin
            ):
                on_frame(self, monotonic(), bytes(event.data))
                return
            super().process_event(event)

    return FrameCallbackConnection
