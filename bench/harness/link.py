"""JSON lines between a benchmark and its child processes: commands in on the child's
stdin, events out on its stdout."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from bench.harness.stack import BenchError
from router.processes.supervisor import Child

__all__ = ["ChildLink", "emit", "stdin_commands"]

Event = dict[str, Any]


def emit(**msg: Any) -> None:
    """In a child: one event to the parent."""
    sys.stdout.write(json.dumps(msg, separators=(",", ":")) + "\n")
    sys.stdout.flush()


async def stdin_commands() -> AsyncIterator[Event]:
    """In a child: the parent's commands, until it closes our stdin."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        yield json.loads(line)


class ChildLink:
    """The parent's end, read on the event loop: no reader thread, so that later children
    can still be forked safely. Events nobody waits for yet are kept for a later expect."""

    def __init__(self, child: Child) -> None:
        assert child.stdin is not None and child.stdout is not None
        self.child = child
        self._reader: asyncio.StreamReader | None = None
        self._transport: asyncio.BaseTransport | None = None
        self._backlog: list[Event] = []

    @property
    def name(self) -> str:
        return self.child.name

    async def open(self) -> ChildLink:
        reader = asyncio.StreamReader(limit=1 << 27)  # a dump is one long line
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), self.child.stdout
        )
        self._reader = reader
        return self

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def send(self, **cmd: Any) -> None:
        stdin = self.child.stdin
        assert stdin is not None
        try:
            stdin.write(json.dumps(cmd).encode() + b"\n")
            stdin.flush()
        except OSError as exc:
            raise BenchError(f"the {self.name} process is gone: {exc}") from None

    async def ask(self, event: str, timeout: float, **cmd: Any) -> Event:
        """Send a command, then expect its answer."""
        self.send(**cmd)
        return await self.expect(event, timeout)

    async def count_up_to(self, expected: int, timeout_s: float) -> None:
        """Ask the child for its count of frames until it reaches `expected` (frames still
        on their way) or `timeout_s` has passed."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (await self.ask("count", 10, cmd="count"))["n"] >= expected:
                return
            await asyncio.sleep(0.1)

    async def expect(
        self, event: str, timeout: float, match: Callable[[Event], bool] | None = None
    ) -> Event:
        def ok(msg: Event) -> bool:
            return msg.get("event") == event and (match is None or match(msg))

        for i, msg in enumerate(self._backlog):
            if ok(msg):
                return self._backlog.pop(i)
        assert self._reader is not None, "open() the link first"
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"the {self.name} process sent no {event!r} in {timeout:.0f}s")
            try:
                line = await asyncio.wait_for(self._reader.readline(), left)
            except TimeoutError:
                continue
            if not line:
                raise BenchError(f"the {self.name} process exited while we waited for {event!r}")
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # stray output
            if ok(msg):
                return dict(msg)
            self._backlog.append(msg)
