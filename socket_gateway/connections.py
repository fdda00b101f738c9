"""The gateway's local connection map and the fan-out of push frames to it.

A push frame is built once per batch up to its `pos` (`shared.wire.push_prefix`); each
connection completes it with its own position (`shared.positions`), because each
connection stands at its own place in its user's logs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shared.models import Registration
from shared.positions import encode_pos, first_after, seq_of
from shared.wire import push_frame

__all__ = ["MAX_UNACKED", "ClientConn", "Held", "LocalConnections", "Marks", "Sent", "Sink"]

# A live push that reached a connection while it was being replayed to: which log (`p`,
# `b`, `g`), its seq there (0: not logged), its frame prefix and its push_id. Written
# after the replay.
Held = tuple[str, int, bytes, str]
# A push written to a connection and not acked yet: the `pos` it carried, its log, its
# seq there (0: not logged) and its push_id. An ack of a `pos` takes every entry up to
# the last one that carried it (`LocalConnections.ack`).
Sent = tuple[str, str, int, str]
# Unacked pushes remembered per connection; past it the oldest are forgotten (counted):
# they stay in the inbox, so a client that never acks gets them again on its next
# connect, and its memory here stays bounded (about 60 KB at most). The SDKs ack at most
# every 100 ms: 512 covers a burst of 5,000 pushes a second to one device (128 did not
# cover 200 pushes in 50 ms).
MAX_UNACKED = 512


class Sink(Protocol):
    """Where a connection's bytes go: a WebSocket transport, or a list in unit tests."""

    def is_open(self) -> bool: ...
    def buffered(self) -> int: ...
    def write(self, data: bytes) -> None: ...
    def abort(self) -> None: ...
    def close(self, code: int, reason: str = "") -> None: ...


@dataclass(eq=False, slots=True)
class ClientConn:
    """One local connection and its position: the highest seq it was written per log."""

    uid: str
    conn_id: str
    sink: Sink
    p: int = 0
    b: int = 0
    o: int = 0
    g: int = 0
    group: str = ""
    # The P2P seqs its replay sent: (after, upto] of the log and the inbox's seqs, so a
    # live copy of one of them (a push that raced the replay) is not written twice.
    skip: tuple[int, int, set[int]] | None = None
    # Not None while the replay runs: live pushes wait here, in arrival order.
    held: list[Held] | None = None
    # What it was written and has not acked, in write order (None: nothing).
    sent: list[Sent] | None = None
    # While it came from another group and still reads that group's log (a move's tail,
    # `socket_gateway.resume`): the push ids it was written, so a multicast that reached
    # it through both groups is written once.
    moved: set[str] | None = None
    # The furthest P2P seq its acks may cover (None: no bound): set before a hole that
    # could not be read (`socket_gateway.gap_fill`), which it was never written, so that
    # its later acks leave the hole in the user's inbox (an ack covers all before it).
    ack_cap: int | None = None


@dataclass(slots=True)
class Marks:
    """How far the gateway has followed its topics: a live connection stands there too."""

    group: str = ""
    b: int = 0  # broadcast batches delivered (in seq order) through this seq
    g: int = 0  # the group's multicast batches, likewise
    o: int = 0  # the offline-recipients log, likewise (read from the log: not on the bus)

    def pos(self, conn: ClientConn) -> str:
        if conn.held is not None:  # replaying: where the replay has got to
            return encode_pos(conn.p, conn.b, conn.o, conn.group, conn.g)
        g = max(conn.g, self.g) if conn.group == self.group else conn.g
        return encode_pos(conn.p, max(conn.b, self.b), max(conn.o, self.o), conn.group, g)


@dataclass(slots=True)
class LocalConnections:
    """uid -> its connections on this gateway (several when multi-device)."""

    max_buffer: int = 1 << 20
    marks: Marks = field(default_factory=Marks)
    # Called with (connection, after, upto) for a hole in a connection's P2P sequence; it
    # writes what the log holds of it and then releases the connection.
    gap_filler: Callable[[ClientConn, int, int], None] | None = None
    # The frames of the batch being written, by position: (its prefix, {pos: frame}).
    _frames: list[Any] = field(default_factory=lambda: [None, {}])
    _by_uid: dict[str, list[ClientConn]] = field(default_factory=dict)
    _count: int = 0
    # Slow consumers aborted (over `max_buffer` unsent): what was unsent is lost to them
    # (a stored push comes back on their next connect). `on_slow` is told each one's
    # unsent bytes, for the shell's log.
    slow_aborted: int = 0
    on_slow: Callable[[int], None] | None = None
    unacked_forgotten: int = 0  # entries past MAX_UNACKED: not acked here, still queued
    added: int = 0  # connections ever added: clients' successful connects (dispatch's)

    def __len__(self) -> int:
        return self._count

    def add(self, conn: ClientConn) -> None:
        self._by_uid.setdefault(conn.uid, []).append(conn)
        self._count += 1
        self.added += 1

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
        return bool(self.of((reg,)))

    def of(self, regs: Iterable[Registration]) -> list[ClientConn]:
        """The connections of `regs` still here (found by uid: as many steps as regs)."""
        found = []
        for reg in regs:
            found += [c for c in self._by_uid.get(reg.uid, ()) if c.conn_id == reg.conn_id]
        return found

    def uids(self) -> list[str]:
        """The users with a connection here."""
        return list(self._by_uid)

    def registrations(self) -> list[Registration]:
        return [Registration(c.uid, c.conn_id) for c in self]

    def __iter__(self) -> Iterator[ClientConn]:
        for conns in self._by_uid.values():
            yield from conns

    def write_frame(self, conn: ClientConn, frame: bytes) -> bool:
        """Write one frame to one connection (aborting it if it is too slow)."""
        return self._write(conn.sink, frame)

    def write_push(
        self, conn: ClientConn, prefix: bytes, log: str, seq: int, ref: str, recovered: bool
    ) -> bool:
        """Write one push (a replay's, a gap fill's) at the connection's position now,
        and remember it until it is acked."""
        pos = self.marks.pos(conn)
        if not self._write(conn.sink, push_frame(prefix, pos, recovered)):
            return False
        self._note(conn, pos, log, seq, ref)
        return True

    def ack(self, conn: ClientConn, pos: str) -> list[Sent] | None:
        """An ack of `pos` from `conn`: the pushes it covers, taken out (cumulative: every
        entry up to the last that carried `pos`). None when no entry carried it: unknown,
        ahead of what was written, already acked, or forgotten."""
        sent = conn.sent
        if not sent:
            return None
        for i in range(len(sent) - 1, -1, -1):
            if sent[i][0] == pos:
                acked = sent[: i + 1]
                rest = sent[i + 1 :]
                conn.sent = rest or None
                return acked
        return None

    def _note(self, conn: ClientConn, pos: str, log: str, seq: int, ref: str) -> None:
        if conn.moved is not None:
            conn.moved.add(ref)
        sent = conn.sent
        if sent is None:
            conn.sent = [(pos, log, seq, ref)]
            return
        sent.append((pos, log, seq, ref))
        if len(sent) > MAX_UNACKED:
            del sent[0]
            self.unacked_forgotten += 1

    def write_all(self, frame: bytes) -> int:
        """Write one pre-built frame (a control frame) to every open connection."""
        write = self._write
        return sum(write(c.sink, frame) for conns in self._by_uid.values() for c in conns)

    def write_to(self, uids: Iterable[str], frame: bytes) -> tuple[list[str], list[str]]:
        """Write one pre-built frame to every open connection of each uid."""
        delivered: list[str] = []
        missing: list[str] = []
        for uid in uids:
            wrote = False
            for conn in self._by_uid.get(uid, ()):
                wrote = self._write(conn.sink, frame) or wrote
            (delivered if wrote else missing).append(uid)
        return delivered, missing

    def deliver_all(self, prefix: bytes, log: str, seq: int, ref: str = "") -> int:
        """Write a push to every open local connection; returns how many."""
        put = self._put
        return sum(put(c, log, seq, prefix, ref) for conns in self._by_uid.values() for c in conns)

    def deliver(
        self, uids: Iterable[str], prefix: bytes, log: str, seq: int, ref: str = ""
    ) -> tuple[list[str], list[str]]:
        """Write a batch's push to every open connection of each uid; (delivered,
        missing) uids. The prefix is built once; each connection adds its position."""
        delivered: list[str] = []
        missing: list[str] = []
        by_uid = self._by_uid
        put = self._put
        for uid in uids:
            wrote = False
            for conn in by_uid.get(uid, ()):
                wrote = put(conn, log, seq, prefix, ref) or wrote
            (delivered if wrote else missing).append(uid)
        return delivered, missing

    def deliver_p2p(
        self,
        uids: Sequence[str],
        seqs: Sequence[int],
        prefix: bytes,
        ref: str = "",
        epochs: Sequence[int] = (),
    ) -> tuple[list[str], list[str]]:
        """Like `deliver`, for P2P: each uid has its own seq (none when not stored),
        carried as its counter and its log's epoch (`shared.positions`)."""
        delivered: list[str] = []
        missing: list[str] = []
        by_uid = self._by_uid
        put = self._put
        for i, uid in enumerate(uids):
            seq = (seq_of(epochs[i], seqs[i]) if epochs else seqs[i]) if seqs else 0
            wrote = False
            for conn in by_uid.get(uid, ()):
                wrote = put(conn, "p", seq, prefix, ref) or wrote
            (delivered if wrote else missing).append(uid)
        return delivered, missing

    def release(self, conn: ClientConn) -> int:
        """End a connection's replay: write what waited meanwhile; how many were written."""
        held, conn.held = conn.held, None
        put = self._put
        return sum(put(conn, log, seq, prefix, ref) for log, seq, prefix, ref in held or ())

    def _put(self, conn: ClientConn, log: str, seq: int, prefix: bytes, ref: str) -> bool:
        """One push to one connection, unless it already had it; True if it is (or will
        be, once its replay ends) written."""
        held = conn.held
        if held is not None:
            if not conn.sink.is_open():
                return False
            held.append((log, seq, prefix, ref))
            return True
        if seq and self._had(conn, log, seq, prefix, ref):
            return True
        pos = self.marks.pos(conn)
        if not self._write(conn.sink, self._frame(prefix, pos)):
            return False
        self._note(conn, pos, log, seq, ref)
        return True

    def _had(self, conn: ClientConn, log: str, seq: int, prefix: bytes, ref: str) -> bool:
        """Whether the connection already had (or will have) this logged push; if not,
        it stands at `seq` in `log` from now on."""
        if log == "p":
            skip = conn.skip
            if skip is not None and (skip[0] < seq <= skip[1] or seq in skip[2]):
                return True  # the replay (or a gap fill) wrote it
            if seq > first_after(conn.p, seq) and self.gap_filler is not None:
                # A hole in the user's P2P sequence: a push that failed for this
                # connection (its gateway was restarting) or one still on its way.
                # This and what follows wait until the hole is read from the log.
                conn.held = [(log, seq, prefix, ref)]
                self.gap_filler(conn, conn.p, seq - 1)
                return True
            conn.p = max(conn.p, seq)
        elif log == "b":
            if seq <= conn.b:
                return True  # the replay wrote it
            conn.b = seq
        elif log == "o":
            if seq <= conn.o:
                return True
            conn.o = seq
        elif conn.group == self.marks.group:
            if seq <= conn.g:
                return True
            conn.g = seq
            if conn.moved is not None and ref in conn.moved:
                # Written from the old group's log (the move's replay or its seam): a
                # multicast resolved the user to both groups, its old route not yet gone.
                return True
        return False

    def _frame(self, prefix: bytes, pos: str) -> bytes:
        """The frame of `prefix` at `pos`. Connections that stand at the same place (users
        without P2P history, in a broadcast) share one; a batch keeps at most 64."""
        frames = self._frames
        if frames[0] is not prefix:  # a new batch: the last one's frames are moot
            frames[0], frames[1] = prefix, {}
        by_pos: dict[str, bytes] = frames[1]
        frame = by_pos.get(pos)
        if frame is None:
            frame = push_frame(prefix, pos)
            if len(by_pos) < 64:
                by_pos[pos] = frame
        return frame

    def _write(self, sink: Sink, frame: bytes) -> bool:
        """Write to one open connection. One whose unsent buffer is over `max_buffer` is
        a slow consumer: it is aborted rather than allowed to grow without bound."""
        if not sink.is_open():
            return False
        if sink.buffered() > self.max_buffer:
            self.abort_slow(sink)
            return False
        sink.write(frame)
        return True

    def abort_slow(self, sink: Sink) -> None:
        """Abort a slow consumer (over `max_buffer` unsent): counted, and told."""
        unsent = sink.buffered()
        self.slow_aborted += 1
        sink.abort()
        if self.on_slow is not None:
            self.on_slow(unsent)
