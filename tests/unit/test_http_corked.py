"""push_service.http_server's corked transport: what uvicorn writes in one loop turn (an
answer's head, then its body) leaves in one write, before any close."""

from __future__ import annotations

import asyncio
from typing import Any

from push_service.http_server import _Corked


class Transport:
    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(data)

    def close(self) -> None:
        self.calls.append("close")
        self.closing = True

    def abort(self) -> None:
        self.calls.append("abort")
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 7

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else None


async def test_one_turn_of_writes_is_one_write() -> None:
    t = Transport()
    corked = _Corked(t, asyncio.get_running_loop())  # type: ignore[arg-type]
    corked.write(b"HTTP/1.1 200 OK\r\n\r\n")
    corked.writelines([b"{", b"}"])
    assert t.calls == [] and corked.get_write_buffer_size() == 7 + 21
    await asyncio.sleep(0)
    assert t.calls == [b"HTTP/1.1 200 OK\r\n\r\n{}"]
    corked.write(b"next")  # the next turn's: a write of its own
    await asyncio.sleep(0)
    assert t.calls[1:] == [b"next"]
    assert corked.get_extra_info("peername") == ("127.0.0.1", 1)


async def test_a_close_sends_what_is_held_first_and_an_abort_drops_it() -> None:
    t = Transport()
    corked = _Corked(t, asyncio.get_running_loop())  # type: ignore[arg-type]
    corked.write(b"408 answer")
    corked.close()
    await asyncio.sleep(0)
    assert t.calls == [b"408 answer", "close"]
    t2 = Transport()
    corked = _Corked(t2, asyncio.get_running_loop())  # type: ignore[arg-type]
    corked.write(b"half")
    corked.abort()
    await asyncio.sleep(0)
    assert t2.calls == ["abort"]
