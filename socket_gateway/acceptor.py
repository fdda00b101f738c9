"""Listening sockets whose connections are accepted by a task of ours, not by a server
of the event loop's, so that each one is handed over at its TCP accept (the delivery
link counts and times it from there, before its TLS handshake; socket_gateway.link_server).

As `loop.create_server` does, a host is bound at every address it resolves to (localhost
at 127.0.0.1 and ::1, a dual-stack name at both of its addresses), and "" or None means
every interface (0.0.0.0 and ::); port 0 picks one port, the same on each address. One
accept task per listening socket: with a backlog, `sock_accept` returns at once and would
not yield, so it lets the event loop run every ACCEPTS_PER_TURN connections. A failure
(accept failing, for want of descriptors or otherwise; a connection the handler could not
take) is logged at a throttled rate, that connection closed, and the task goes on after a
pause that grows while failures repeat; it stops only when closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import Callable, Sequence

from shared.backoff import backoff_s
from shared.clock import Clock
from shared.throttled import ThrottledLine

__all__ = ["ACCEPTS_PER_TURN", "Acceptor", "retry_after"]

log = logging.getLogger(__name__)

# Connections accepted in a row before the accept task lets the event loop run
ACCEPTS_PER_TURN = 32
# After a failure the task pauses this long, doubled each time failures repeat up to
# RETRY_MAX_S (out of descriptors, for one, lasts until some are closed).
RETRY_FIRST_S = 0.01
RETRY_MAX_S = 1.0
LOG_EVERY_S = 10.0
# Binding every address at a port 0 picked on the first: tries, when another process
# holds that port on one of the others
_PORT_TRIES = 5

Handler = Callable[[socket.socket, object], None]


def retry_after(failures: int) -> float:
    """The pause after `failures` failures in a row (at least 1)."""
    return backoff_s(failures, RETRY_FIRST_S, RETRY_MAX_S, rand=None)


class Acceptor:
    """Listens on `host`:`port` and hands each accepted socket, with its peer address,
    to `handler`, which owns it from then on."""

    def __init__(self, handler: Handler, clock: Clock, name: str) -> None:
        self._handler = handler
        self._clock = clock
        self._name = name
        self._listeners: list[socket.socket] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.failures = ThrottledLine(
            log,
            "%(name)s: %(what)s (%(exc)s); %(n)d failure(s) since the last line, the next "
            "accept in %(pause)gs",
            every_s=LOG_EVERY_S,
            now=clock.monotonic,
        )

    @property
    def sockets(self) -> list[socket.socket]:
        return list(self._listeners)

    async def listen(self, host: str | None, port: int, backlog: int) -> int:
        """Bind every address of `host` and start accepting; returns the port."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        addresses = list(dict.fromkeys((family, address) for family, _, _, _, address in infos))
        for attempt in range(_PORT_TRIES):
            try:
                self._listeners = _bind_all(addresses, port, backlog)
                break
            except OSError as exc:
                if port != 0 or exc.errno != errno.EADDRINUSE or attempt == _PORT_TRIES - 1:
                    raise
        for listener in self._listeners:
            self._tasks.append(loop.create_task(self._accept(listener), name=self._name))
        return int(self._listeners[0].getsockname()[1])

    async def close(self) -> None:
        """Stop accepting and close the listening sockets."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for listener in self._listeners:
            listener.close()

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            for _ in range(ACCEPTS_PER_TURN):
                try:
                    sock, peer = await loop.sock_accept(listener)
                except Exception as exc:  # e.g. EMFILE; CancelledError (close) ends it
                    failures += 1
                    await self._failed(failures, "cannot accept", exc)
                    continue
                try:
                    self._handler(sock, peer)
                except Exception as exc:
                    sock.close()
                    failures += 1
                    await self._failed(failures, f"could not take a connection from {peer}", exc)
                    continue
                failures = 0
            await asyncio.sleep(0)  # let what was accepted start, and the rest run

    async def _failed(self, failures: int, what: str, exc: Exception) -> None:
        pause = retry_after(failures)
        self.failures.note(
            exc_info=None if isinstance(exc, OSError) else exc,
            name=self._name,
            what=what,
            exc=exc,
            pause=pause,
        )
        await asyncio.sleep(pause)


def _bind_all(
    addresses: Sequence[tuple[int, tuple[object, ...]]], port: int, backlog: int
) -> list[socket.socket]:
    """A listening socket per address, all on one port (port 0: the first one's)."""
    bound: list[socket.socket] = []
    try:
        for family, resolved in addresses:
            address = (resolved[0], port, *resolved[2:]) if bound else resolved
            sock = _bind(family, address, backlog)
            if sock is None:
                continue
            bound.append(sock)
            port = int(sock.getsockname()[1])
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    if not bound:
        raise OSError(errno.EAFNOSUPPORT, f"no address to listen on in {addresses}")
    return bound


def _bind(family: int, address: tuple[object, ...], backlog: int) -> socket.socket | None:
    """A non-blocking socket listening at `address`; None for an address family this
    host has no sockets for (as `create_server`, which skips them)."""
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        return None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:  # :: must leave 0.0.0.0 to the IPv4 socket
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {address}: {exc.strerror}") from exc
    return sock
