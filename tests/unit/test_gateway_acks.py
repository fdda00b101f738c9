"""Client acks on the gateway, without I/O: what an ack covers (`LocalConnections.ack`)
and how the reporter batches them (`AckReporter`), with in-memory writers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence, Set
from types import SimpleNamespace
from typing import cast

import pytest

from router.receipts.base import ACKED, DELIVERED, EXPIRED, derives_ack
from router.recovery.base import UserHistory
from shared.clock import SystemClock
from shared.errors import RegistryUnavailable
from shared.keys import slot_tag
from shared.models import Message
from shared.positions import seq_of
from shared.wire import push_prefix
from socket_gateway.acks import AckReporter
from socket_gateway.connections import MAX_UNACKED, ClientConn, LocalConnections
from socket_gateway.gap_fill import GapFills
from socket_gateway.tracing import GatewayTracing
from tests.unit.sinks import ListSink


def msg(n: int) -> Message:
    return Message(f"m{n}", f"p{n}", 0, "admin", b"1", 1)


def pos_of(frame: bytes) -> str:
    return str(json.loads(frame[2:])["pos"])


class Writes:
    """The inbox acks and receipt writes, recorded; each can be held until released."""

    def __init__(self) -> None:
        self.acked: list[tuple[str, int]] = []
        self.marked: list[tuple[str, dict[str, list[str]]]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def ack(self, wanted: Sequence[tuple[str, int]]) -> list[None]:
        await self.gate.wait()
        self.acked += wanted
        return [None] * len(wanted)

    async def mark(self, state: str, by_push: Mapping[str, Sequence[str]]) -> None:
        await self.gate.wait()
        self.marked.append((state, {p: list(u) for p, u in by_push.items()}))


def setup() -> tuple[LocalConnections, ClientConn, ListSink]:
    conns = LocalConnections()
    sink = ListSink()
    conn = ClientConn("amy", "c1", sink)
    conns.add(conn)
    return conns, conn, sink


def test_an_ack_covers_everything_up_to_the_last_frame_with_its_pos() -> None:
    conns, conn, sink = setup()
    for n in (1, 2, 3):
        conns.deliver_p2p(["amy"], [n], push_prefix(msg(n)), f"p{n}")
    conns.deliver_p2p(["amy"], [], push_prefix(msg(4)), "p4")  # store:false: same pos as 3
    pos = [pos_of(f) for f in sink.frames]
    assert pos[2] == pos[3]
    acked = conns.ack(conn, pos[1])
    assert acked is not None and [(e[2], e[3]) for e in acked] == [(1, "p1"), (2, "p2")]
    assert conns.ack(conn, pos[1]) is None  # already acked
    assert conns.ack(conn, "1~99~0~0~~0") is None  # ahead of what was sent
    acked = conns.ack(conn, pos[3])
    assert acked is not None and [e[3] for e in acked] == ["p3", "p4"]
    assert conn.sent is None


def test_a_connection_remembers_a_bounded_number_of_unacked_pushes() -> None:
    conns, conn, _ = setup()
    for n in range(1, MAX_UNACKED + 11):
        conns.deliver_p2p(["amy"], [n], push_prefix(msg(n)), f"p{n}")
    assert conn.sent is not None and len(conn.sent) == MAX_UNACKED
    assert conns.unacked_forgotten == 10 and conn.sent[0][2] == 11


async def test_acks_are_written_in_batches_and_none_waits_after_a_flush() -> None:
    conns, conn, sink = setup()
    writes = Writes()
    reporter = AckReporter(conns, writes, writes, SystemClock(), flush_s=0.01)
    for n in range(1, 4):
        conns.deliver_p2p(["amy"], [n], push_prefix(msg(n)), f"p{n}")
    frames = [pos_of(f) for f in sink.frames]
    writes.gate.clear()  # the first flush hangs in Redis ...
    reporter.on_ack(conn, frames[0])
    await asyncio.sleep(0.05)
    assert reporter.counts.flushes == 1 and writes.acked == []
    reporter.on_ack(conn, frames[2])  # ... while the last ack of the burst arrives
    reporter.on_ack(conn, "")  # malformed: counted, never a close
    writes.gate.set()
    for _ in range(100):  # no further ack comes: the waiting one is flushed all the same
        if not reporter.pending:
            break
        await asyncio.sleep(0.01)
    assert not reporter.pending and reporter.counts.flushes == 2
    # One position per user and flush: the furthest its devices acked (the inbox is the
    # log after it).
    assert writes.acked == [("amy", 1), ("amy", 3)]
    assert [m[1] for m in writes.marked] == [{"p1": ["amy"]}, {"p2": ["amy"], "p3": ["amy"]}]
    assert (reporter.counts.acks, reporter.counts.acked, reporter.counts.bad) == (2, 3, 1)
    await reporter.aclose()


class Ordered(Writes):
    """Writes that record the order in which they start and end."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []

    async def ack(self, wanted: Sequence[tuple[str, int]]) -> list[None]:
        self.events.append("ack")
        await asyncio.sleep(0.01)
        return await super().ack(wanted)

    async def mark(self, state: str, by_push: Mapping[str, Sequence[str]]) -> None:
        self.events.append(f"{state}:start")
        await asyncio.sleep(0.01)
        await super().mark(state, by_push)
        self.events.append(f"{state}:end")


async def test_a_replays_expired_marks_are_written_before_the_acks_that_pass_them() -> None:
    """Read in between, an entry a replay left out for its ttl_s would read acked (its
    receipt derives acks from the acked position); the other marks go with the acks."""
    conns, conn, sink = setup()
    writes = Ordered()
    reporter = AckReporter(conns, writes, writes, SystemClock(), flush_s=0.01)
    conns.deliver_p2p(["amy"], [2], push_prefix(msg(2)), "p2")
    reporter.report(EXPIRED, "p1", ["amy"])
    reporter.report(DELIVERED, "p3", ["amy"])
    reporter.on_ack(conn, pos_of(sink.frames[0]))
    await settle(reporter)
    assert writes.events.index("x:end") < writes.events.index("ack")
    assert writes.events.index("d:start") > writes.events.index("x:end")
    assert writes.acked == [("amy", 2)]
    await reporter.aclose()


class Buggy(Writes):
    """Writes whose inbox acks raise a bug's error (not an outage's) `bugs` times."""

    def __init__(self, bugs: int) -> None:
        super().__init__()
        self.bugs = bugs

    async def ack(self, wanted: Sequence[tuple[str, int]]) -> list[None]:
        if self.bugs:
            self.bugs -= 1
            raise KeyError("a bug in the store")
        return await super().ack(wanted)


async def settle(reporter: AckReporter) -> None:
    for _ in range(100):
        if not reporter.pending:
            return
        await asyncio.sleep(0.01)


async def test_a_flush_that_fails_with_a_bug_keeps_its_acks_for_one_more_try(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: only an outage's error was caught; any other escaped the flush's task,
    which nobody awaits: the batch was dropped, said at garbage collection if at all."""
    conns, conn, sink = setup()
    writes = Buggy(bugs=1)
    reporter = AckReporter(conns, writes, writes, SystemClock(), flush_s=0.01)
    conns.deliver_p2p(["amy"], [1], push_prefix(msg(1)), "p1")
    with caplog.at_level("ERROR", "socket_gateway.acks"):
        reporter.on_ack(conn, pos_of(sink.frames[0]))
        await settle(reporter)
    assert writes.acked == [("amy", 1)] and writes.marked == [(ACKED, {"p1": ["amy"]})]
    assert (reporter.counts.failed_flushes, reporter.counts.dropped) == (1, 0)
    [record] = [r for r in caplog.records if r.name == "socket_gateway.acks"]
    assert record.getMessage() == "writing acks failed (kept for one more try)"
    assert record.exc_info is not None and record.exc_info[0] is KeyError
    await reporter.aclose()


async def test_a_bug_twice_drops_its_updates_counted_and_the_next_acks_are_written() -> None:
    """A bug that comes back every time must not hold every later ack behind it."""
    conns, conn, sink = setup()
    writes = Buggy(bugs=2)
    reporter = AckReporter(conns, writes, writes, SystemClock(), flush_s=0.01)
    for n in (1, 2):
        conns.deliver_p2p(["amy"], [n], push_prefix(msg(n)), f"p{n}")
    reporter.on_ack(conn, pos_of(sink.frames[0]))
    await settle(reporter)
    # The receipt's mark was written the first time (only what failed is tried again);
    # the inbox position failed twice: dropped, counted.
    assert (reporter.counts.failed_flushes, reporter.counts.dropped) == (2, 1)
    assert writes.acked == [] and writes.marked == [(ACKED, {"p1": ["amy"]})]
    reporter.on_ack(conn, pos_of(sink.frames[1]))
    await settle(reporter)
    assert writes.acked == [("amy", 2)]
    assert writes.marked == [(ACKED, {"p1": ["amy"]}), (ACKED, {"p2": ["amy"]})]
    await reporter.aclose()


class Down(Writes):
    """Redis is down: every write fails as an outage's."""

    async def ack(self, wanted: Sequence[tuple[str, int]]) -> list[None]:
        raise RegistryUnavailable("Redis unavailable: Connection refused")

    async def mark(self, state: str, by_push: Mapping[str, Sequence[str]]) -> None:
        raise RegistryUnavailable("Redis unavailable: Connection refused")


async def test_what_the_last_flush_could_not_write_at_shutdown_is_counted_and_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: a gateway stopped during a Redis outage kept its updates "for the next
    try", which never came; they went with the process, counted nowhere."""
    conns, conn, sink = setup()
    writes = Down()
    reporter = AckReporter(conns, writes, writes, SystemClock(), flush_s=0.01)
    for n in (1, 2):
        conns.deliver_p2p(["amy"], [n], push_prefix(msg(n)), f"p{n}")
    reporter.on_ack(conn, pos_of(sink.frames[1]))
    with caplog.at_level("ERROR", "socket_gateway.acks"):
        await reporter.aclose()
    # One inbox position and two receipt marks (p1, p2) were never written.
    assert reporter.counts.dropped == 3 and not reporter.pending
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert line.startswith("3 ack and receipt update(s) not written at shutdown"), line


async def test_a_hole_that_could_not_be_read_is_never_acked_by_the_connection() -> None:
    """A gap fill whose read failed passes the hole over (what waited behind it is
    written), and the connection's acks stop before it: an ack covers everything before
    it, and the hole, never written here, must stay in the user's inbox."""
    conns, conn, sink = setup()
    writes = Writes()
    reporter = AckReporter(conns, writes, writes, SystemClock(), flush_s=0.01)

    async def unreadable(_: tuple[str, int | None]) -> UserHistory:
        raise RegistryUnavailable("redis down")

    work: list[asyncio.Future[None]] = []
    fills = GapFills(
        unreadable, conns, SystemClock(), None, lambda job: work.append(asyncio.ensure_future(job))
    )
    for n in (1, 2):
        conns.deliver_p2p(["amy"], [n], push_prefix(msg(n)), f"p{n}")
    fills.fill(conn, 2, 4)  # 3 and 4 missing; 5 waits behind them
    conns.deliver_p2p(["amy"], [5], push_prefix(msg(5)), "p5")
    await asyncio.gather(*work)
    assert [pos_of(f).split("~")[1] for f in sink.frames][-1] == "5"  # written after all
    reporter.on_ack(conn, pos_of(sink.frames[-1]))
    await reporter.aclose()
    assert writes.acked == [("amy", 2)]  # not 5: the inbox keeps 3, 4 and 5
    assert [m[1] for m in writes.marked] == [{"p1": ["amy"], "p2": ["amy"], "p5": ["amy"]}]


def tagged(n: int) -> str:
    """A slot-tagged push id (a stored, listable P2P push's: its receipt derives acks)."""
    return f"{n:032x}.{slot_tag(n)}"


async def test_a_receipt_that_derives_its_acks_gets_no_mark_of_its_own() -> None:
    """Acks of slot-tagged pushes move the user's position only; an untagged push (or a
    store:false one: no position) is marked as before, and so is an entry that may have
    left the inbox by its bound (more than inbox_max behind the position acked)."""
    conns, conn, sink = setup()
    writes = Writes()
    reporter = AckReporter(conns, writes, writes, SystemClock(), flush_s=0.01, inbox_max=3)
    ids = {n: tagged(n) for n in (1, 2, 5, 6)}
    ids[3] = "untagged3"
    for n in (1, 2, 3, 5, 6):
        conns.deliver_p2p(["amy"], [n], push_prefix(msg(n)), ids[n])
    conns.deliver_p2p(["amy"], [], push_prefix(msg(7)), tagged(7))  # store:false
    reporter.on_ack(conn, pos_of(sink.frames[-1]))
    await reporter.aclose()
    assert writes.acked == [("amy", 6)]
    # 1 and 2 are 5 and 4 behind 6 (inbox_max 3): maybe pushed out, so marked.
    assert writes.marked == [
        (ACKED, {p: ["amy"] for p in (ids[1], ids[2], "untagged3", tagged(7))})
    ]


def test_derives_ack_needs_a_tag_a_position_covered_in_its_epoch_and_the_inbox() -> None:
    push = tagged(1)
    assert derives_ack(push, 5, 5, 100)
    assert derives_ack(push, seq_of(7, 5), seq_of(7, 9), 100)
    assert not derives_ack("f" * 32, 5, 5, 100)  # untagged
    assert not derives_ack(push, 0, 5, 100)  # not stored
    assert not derives_ack(push, 6, 5, 100)  # past the position acked (a hole before it)
    assert not derives_ack(push, seq_of(6, 5), seq_of(7, 9), 100)  # another epoch
    assert not derives_ack(push, 5, 105, 100)  # may have left the inbox by its bound


class Spans:
    """The tracing side of a flush: each push's acked uids, as GatewayTracing gets them."""

    def __init__(self) -> None:
        self.acked: list[dict[str, set[str]]] = []

    def acked_spans(self, by_push: Mapping[str, Set[str]], written: bool) -> None:
        self.acked.append({p: set(u) for p, u in by_push.items()})


async def test_a_pushs_derived_and_marked_acks_make_one_span_with_both() -> None:
    conns = LocalConnections()
    amy, bob = ClientConn("amy", "c1", ListSink()), ClientConn("bob", "c2", ListSink())
    conns.add(amy)
    conns.add(bob)
    push = tagged(1)
    conns.deliver_p2p(["amy", "bob"], [1, 1], push_prefix(msg(1)), push)
    bob.ack_cap = 0  # a hole before: its ack is marked, amy's derived
    spans = Spans()
    writes = Writes()
    tracing = cast(GatewayTracing, SimpleNamespace(acked=spans.acked_spans))
    reporter = AckReporter(conns, writes, writes, SystemClock(), flush_s=0.01, tracing=tracing)
    for conn in (amy, bob):
        sink = cast(ListSink, conn.sink)
        reporter.on_ack(conn, pos_of(sink.frames[-1]))
    await reporter.aclose()
    assert writes.marked == [(ACKED, {push: ["bob"]})]
    assert spans.acked == [{push: {"amy", "bob"}}]
