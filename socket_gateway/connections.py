"""The gateway's local connection map and the fan-out of pre-built frames to it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from shared.models import Registration

__all__ = ["ClientConn", "LocalConnections", "Sink"]


class Sink(Protocol):
    """Where a connection's bytes go: a WebSocket transport, or a list in unit tests."""

    def is_open(self) -> bool: ...
    def buffered(self) -> int: ...
    def write(self, data: bytes) -> None: ...
    def abort(self) -> None: ...
    def close(self, code: int, reason: str = "") -> None: ...


@dataclass(eq=False, slots=True)
class ClientConn:
    uid: str
    conn_id: str
    sink: Sink


@dataclass(slots=True)
class LocalConnections:
    """uid -> its connections on this gateway (several when multi-device)."""

    max_buffer: int = 1 << 20
    _by_uid: dict[str, list[ClientConn]] = field(default_factory=dict)
    _count: int = 0
    slow_aborted: int = 0

    def __len__(self) -> int:
        return self._count

    def add(self, conn: ClientConn) -> None:
        self._by_uid.setdefault(conn.uid, []).append(conn)
        self._count += 1

    def remove(self, conn: ClientConn) -> bool:
        conns = self._by_uid.get(conn.uid)
        if not conns or conn not in conns:
            return False
        conns.remove(conn)
        if not conns:
            del self._by_uid[conn.uid]
        self._count -= 1
        return True

    def holds_registration(self, reg: Registration) -> bool:
        return any(c.conn_id == reg.conn_id for c in self._by_uid.get(reg.uid, ()))

    def registrations(self) -> list[Registration]:
        return [Registration(c.uid, c.conn_id) for c in self]

    def __iter__(self) -> Iterator[ClientConn]:
        for conns in self._by_uid.values():
            yield from conns

    def deliver_all(self, frame: bytes) -> int:
        """Write `frame` to every open local connection; returns how many."""
        write = self._write
        return sum(write(conn.sink, frame) for conns in self._by_uid.values() for conn in conns)

    def deliver(self, uids: Iterable[str], frame: bytes) -> tuple[list[str], list[str]]:
        """Write `frame` to every open connection of each uid; (delivered, missing) uids.

        The frame is built once by the caller and the same bytes go to every transport.
        """
        delivered: list[str] = []
        missing: list[str] = []
        by_uid = self._by_uid
        write = self._write
        for uid in uids:
            wrote = False
            for conn in by_uid.get(uid, ()):
                wrote = write(conn.sink, frame) or wrote
            (delivered if wrote else missing).append(uid)
        return delivered, missing

    def _write(self, sink: Sink, frame: bytes) -> bool:
        """Write to one open connection. One whose unsent buffer is over `max_buffer` is
        a slow consumer: it is aborted rather than allowed to grow without bound."""
        if not sink.is_open():
            return False
        if sink.buffered() > self.max_buffer:
            self.slow_aborted += 1
            sink.abort()
            return False
        sink.write(frame)
        return True
