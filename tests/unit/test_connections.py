from __future__ import annotations

from shared.positions import seq_of
from socket_gateway.connections import ClientConn, LocalConnections
from tests.unit.sinks import ListSink


def test_every_connection_of_every_listed_uid_gets_the_same_bytes() -> None:
    conns = LocalConnections()
    a1, a2, b = ListSink(), ListSink(), ListSink()
    conns.add(ClientConn("a", "c1", a1))
    conns.add(ClientConn("a", "c2", a2))
    conns.add(ClientConn("b", "c3", b))
    frame = b"\x81\x02hi"
    delivered, missing = conns.write_to(["a", "zz", "b"], frame)
    assert delivered == ["a", "b"]
    assert missing == ["zz"]
    assert a1.frames == a2.frames == b.frames == [frame]
    assert a1.frames[0] is b.frames[0]  # built once, written many times


def test_closing_and_slow_connections_are_skipped() -> None:
    conns = LocalConnections(max_buffer=100)
    closing, slow = ListSink(open=False), ListSink(backlog=101)
    conns.add(ClientConn("a", "c1", closing))
    conns.add(ClientConn("b", "c2", slow))
    delivered, missing = conns.write_to(["a", "b"], b"x")
    assert delivered == [] and missing == ["a", "b"]
    assert slow.aborted and conns.slow_aborted == 1
    assert closing.frames == [] and slow.frames == []


def test_a_slow_consumer_aborted_is_told_with_its_unsent_bytes() -> None:
    told: list[int] = []
    conns = LocalConnections(max_buffer=100, on_slow=told.append)
    conns.add(ClientConn("b", "c2", ListSink(backlog=101)))
    conns.write_to(["b"], b"x")
    assert told == [101] and conns.slow_aborted == 1


def test_remove_and_registrations() -> None:
    conns = LocalConnections()
    c1, c2 = ClientConn("a", "c1", ListSink()), ClientConn("a", "c2", ListSink())
    conns.add(c1)
    conns.add(c2)
    assert len(conns) == 2
    assert conns.remove(c1)
    assert not conns.remove(c1)
    assert [r.conn_id for r in conns.registrations()] == ["c2"]
    assert conns.remove(c2) and len(conns) == 0


def test_a_p2p_push_of_a_new_epoch_is_written_and_its_hole_read_from_the_log() -> None:
    """Redis lost the user's log: the first push of the new one (n 1) follows anything;
    a later one (n 3) reads the hole (n 1, 2) from the log first; never skipped as a
    seq the connection's replay covered."""
    holes: list[tuple[int, int]] = []
    conns = LocalConnections(gap_filler=lambda c, after, upto: holes.append((after, upto)))
    conn = ClientConn("amy", "c1", ListSink())
    conn.p, conn.skip = seq_of(100, 40), (0, seq_of(100, 40), set())
    conns.add(conn)
    assert conns.deliver_p2p(["amy"], [1], b"x", "p1", epochs=[200]) == (["amy"], [])
    assert conn.p == seq_of(200, 1) and holes == []
    assert isinstance(conn.sink, ListSink) and len(conn.sink.frames) == 1
    fresh = ClientConn("bob", "c2", ListSink())  # nothing yet: n 1 of any log follows
    conns.add(fresh)
    conns.deliver_p2p(["bob"], [1], b"x", "p1", epochs=[300])
    assert holes == [] and fresh.p == seq_of(300, 1)
    conns.deliver_p2p(["bob"], [3], b"x", "p3", epochs=[300])
    assert holes == [(seq_of(300, 1), seq_of(300, 2))]


def test_a_multicast_the_move_s_seam_wrote_is_not_written_again_by_the_new_group() -> None:
    """The Pub/Sub trial: after its gateway was killed, a client resumed in another
    group, and a multicast resolved to it in both groups (its old route not yet gone)
    was written twice, once from the old group's log (the move's tail), once live."""
    conns = LocalConnections()
    conns.marks.group = "g2"
    sink = ListSink()
    conn = ClientConn("amy", "c1", sink)
    conn.group, conn.moved = "g2", {"p-multi"}  # the tail wrote p-multi already
    conns.add(conn)
    assert conns.deliver(["amy"], b"prefix-1", "g", 5, "p-multi") == (["amy"], [])
    assert sink.frames == [] and conn.g == 5  # not again; the position moves on
    conns.deliver(["amy"], b"prefix-2", "g", 6, "p-other")
    assert len(sink.frames) == 1 and conn.g == 6
    conn.moved = None  # the tail is over: the group's log alone says what it had
    conns.deliver(["amy"], b"prefix-3", "g", 7, "p-multi")
    assert len(sink.frames) == 2
