"""The delivery link's own accept loop (socket_gateway/link_server.py, acceptor.py),
over real sockets on the test suite's event loop, the standard library's (not uvloop):
with a backlog, `sock_accept` returns at once, so connections are accepted and their
tasks created before any of them has started. One cut before its task starts (evicted,
or at shutdown) is still closed and forgotten, and counted once. The link listens on
every address of its host ("" is every interface), and a connection it cannot take, or
an accept that keeps failing, neither stops it nor holds the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import time
from collections.abc import AsyncIterator

import pytest

from shared.clock import SystemClock
from shared.link_frames import FrameReader, frame
from shared.proto import gateway_pb2
from socket_gateway import link_server
from socket_gateway.delivery import LinkCounts
from socket_gateway.link_server import LinkServer, Tickets
from tests.integration.gateway_calls import TOKEN, delivered_over_a_link
from tests.integration.stack import client, gateway
from tests.waiting import wait_for

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
        await wait_for(lambda: not server._conns, "every connection forgotten")
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


def _refusal(data: bytes) -> gateway_pb2.StreamReply:
    (reply,) = [gateway_pb2.StreamReply.FromString(f) for f in FrameReader(256).feed(data)]
    return reply


async def _stranger(family: int, host: str, port: int) -> gateway_pb2.StreamReply:
    """A frame that is no hello, sent from `host`; the link's refusal."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.wait_for(loop.sock_connect(sock, (host, port)), 2)
        await loop.sock_sendall(sock, frame(b"junk"))
        return _refusal(await _read_to_eof(sock, 2.0))
    finally:
        sock.close()


async def test_an_empty_host_is_every_interface_on_one_port(redis_url: str, prefix: str) -> None:
    """IMROUTE_GRPC_HOST="" (gRPC's and asyncio's every interface): the gateway starts,
    its link listens on 0.0.0.0 and :: at one port, and a router links and delivers."""
    async with (
        gateway(
            redis_url,
            prefix,
            "gwa",
            "g1",
            grpc_host="",
            advertise_host="127.0.0.1",
            internal_token=TOKEN,
        ) as gw,
        client(gw, "a") as a,
    ):
        link = gw.ports.link if gw.ports is not None else None
        assert link is not None
        bound = sorted(s.getsockname()[0] for s in link._acceptor.sockets)
        assert bound == ["0.0.0.0", "::"]
        assert len({s.getsockname()[1] for s in link._acceptor.sockets}) == 1
        port = link._acceptor.sockets[0].getsockname()[1]
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            assert (await _stranger(family, host, port)).error_code == "UNAUTHENTICATED"
        await delivered_over_a_link(gw, "gwa", a, 3, "e3", token=TOKEN)


async def test_a_connection_the_link_cannot_take_is_closed_and_the_next_one_served(
    link: tuple[LinkServer, int],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, port = link
    accepted = link_server._LinkConn.accepted
    calls = 0

    def first_fails(conn: link_server._LinkConn, sock: socket.socket) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug")
        accepted(conn, sock)

    monkeypatch.setattr(link_server._LinkConn, "accepted", first_fails)
    caplog.set_level(logging.WARNING, "socket_gateway")
    loop = asyncio.get_running_loop()
    broken = socket.socket()
    broken.setblocking(False)
    try:
        await loop.sock_connect(broken, ("127.0.0.1", port))
        assert await _read_to_eof(broken, 1.0) == b""  # closed, without a word
    finally:
        broken.close()
    # The link goes on accepting (after a short pause) and answers the next one.
    refusal = await _stranger(socket.AF_INET, "127.0.0.1", port)
    assert refusal.error_code == "UNAUTHENTICATED"
    (line,) = [r for r in caplog.records if "could not take" in r.getMessage()]
    assert line.exc_info is not None and "a bug" in line.getMessage()


# Run apart, in a process of its own: before, an accept that kept failing held the event
# loop for good.
_FAILING_ACCEPT = """
import asyncio, gc, socket, sys, time
from shared.clock import SystemClock
from shared.proto import gateway_pb2
from socket_gateway.delivery import LinkCounts
from socket_gateway.link_server import LinkServer, Tickets

async def main() -> None:
    clock = SystemClock()
    server = LinkServer(lambda c: gateway_pb2.StreamReply(), Tickets(clock), clock, 1 << 20,
                        LinkCounts())
    port = await server.start("127.0.0.1", 0)
    (listener,) = [o for o in gc.get_objects() if isinstance(o, socket.socket)
                   and o.fileno() >= 0 and o.getsockname() == ("127.0.0.1", port)]
    listener.shutdown(socket.SHUT_RD)  # every accept now fails (EINVAL)
    cpu, started = time.process_time(), time.monotonic()
    ticks = 0
    while time.monotonic() - started < 1.5:  # the loop still runs its other work
        await asyncio.sleep(0.01)
        ticks += 1
    print("ticks", ticks, "cpu", time.process_time() - cpu, flush=True)
    started = time.monotonic()
    await server.close()
    print("closed in", time.monotonic() - started, flush=True)

asyncio.run(main())
"""


async def test_an_accept_that_keeps_failing_backs_off_and_stops_on_close() -> None:
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _FAILING_ACCEPT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    started = time.monotonic()
    try:
        out, err = await asyncio.wait_for(child.communicate(), 10)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    assert child.returncode == 0, (out, err, time.monotonic() - started)
    ticks_line, closed_line = out.decode().splitlines()
    _, ticks, _, cpu = ticks_line.split()
    assert int(ticks) > 50, ticks_line  # about 100 sleeps of 10 ms in 1.5 s
    assert float(cpu) < 0.5, ticks_line  # not spinning
    assert float(closed_line.split()[-1]) < 0.5, closed_line
    # Logged once (then at most every 10 s), with what failed.
    lines = [x for x in err.decode().splitlines() if "cannot accept" in x]
    assert len(lines) == 1 and "Invalid argument" in lines[0], err
