"""The delivery link's own accept loop (socket_gateway/link_server.py), over real
sockets on the test suite's event loop, the standard library's (not uvloop): with a
backlog, `sock_accept` returns at once, so connections are accepted and their tasks
created before any of them has started. One cut before its task starts (evicted, or at
shutdown) is still closed and forgotten, and counted once."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest

from shared.clock import SystemClock
from shared.link_frames import FrameReader
from shared.proto import gateway_pb2
from socket_gateway import link_server
from socket_gateway.delivery import LinkCounts
from socket_gateway.link_server import LinkServer, Tickets
from tests.integration.test_delivery_link import until

pytestmark = pytest.mark.integration

HELLO_S = 0.5


def _answer(call: gateway_pb2.StreamCall) -> gateway_pb2.StreamReply:
    return gateway_pb2.StreamReply(call_id=call.call_id)


@pytest.fixture
async def link(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[LinkServer, int]]:
    """A link on loopback: 2 may wait for their hello, 2 from one address, for 0.5 s."""
    assert "uvloop" not in type(asyncio.get_running_loop()).__module__
    monkeypatch.setattr(link_server, "HELLO_TIMEOUT_S", HELLO_S)
    monkeypatch.setattr(link_server, "MAX_PRE_HELLO", 2)
    monkeypatch.setattr(link_server, "MAX_PRE_HELLO_PER_PEER", 2)
    clock = SystemClock()
    server = LinkServer(_answer, Tickets(clock), clock, 1 << 20, LinkCounts())
    port = await server.start("127.0.0.1", 0)
    try:
        yield server, port
    finally:
        await server.close()


def _connect(port: int, source: str) -> socket.socket:
    """A blocking connect: it completes in the kernel's backlog, with the event loop
    held, so the link finds every connection there at once."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=2, source_address=(source, 0))
    sock.setblocking(False)
    return sock


async def _read_to_eof(sock: socket.socket, timeout: float) -> bytes:
    """What the link sends until it closes; TimeoutError when it does not close."""
    loop = asyncio.get_running_loop()
    data = b""
    async with asyncio.timeout(timeout):
        while chunk := await loop.sock_recv(sock, 4096):
            data += chunk
    return data


async def test_a_link_evicted_before_its_task_started_is_closed_and_counted_once(
    link: tuple[LinkServer, int],
) -> None:
    server, port = link
    socks = [_connect(port, source) for source in ("127.0.0.2", "127.0.0.2", "127.0.0.3")]
    try:
        # The third, from another address, took the place of 127.0.0.2's oldest, which
        # is told why and closed at once, though its task had not started.
        evicted = await _read_to_eof(socks[0], 1.0)
        (reply,) = [gateway_pb2.StreamReply.FromString(f) for f in FrameReader(256).feed(evicted)]
        assert reply.error_code == "RESOURCE_EXHAUSTED" and "127.0.0.2" in reply.error
        assert server.waiting == 2 and server.counts.refused == 1
        for sock in socks[1:]:
            sock.close()
        await until(lambda: not server._conns, "every connection forgotten")
        # Past the hello deadline, nothing is counted again.
        await asyncio.sleep(HELLO_S + 0.3)
        assert server.counts.refused == 1
        assert server.waiting == 0 and not server._conns
    finally:
        for sock in socks:
            sock.close()


async def test_links_waiting_for_their_task_are_closed_at_shutdown(
    link: tuple[LinkServer, int],
) -> None:
    server, port = link
    socks = [_connect(port, source) for source in ("127.0.0.2", "127.0.0.3")]
    try:
        for _ in range(100):  # close as soon as both are accepted: their tasks may not
            if len(server._conns) == 2:  # have started yet
                break
            await asyncio.sleep(0)
        await server.close()
        for sock in socks:
            assert await _read_to_eof(sock, 1.0) == b""
        assert not server._conns and server.waiting == 0
        await asyncio.sleep(HELLO_S + 0.3)
        assert server.counts.refused == 0
    finally:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()
