from __future__ import annotations

from router.testing import ManualClock
from shared.proto import gateway_pb2
from socket_gateway.connections import ClientConn, LocalConnections
from socket_gateway.delivery import (
    ENTRY_OVERHEAD,
    REPLY_GRACE_S,
    DeliverService,
    RecentIds,
    RecentReplies,
)
from tests.unit.sinks import ListSink


def test_a_repeated_id_is_caught_within_the_window() -> None:
    clock = ManualClock()
    ids = RecentIds(clock, window_s=10)
    assert not ids.check_and_add("b1")
    clock.advance(9.9)
    assert ids.check_and_add("b1")
    assert not ids.check_and_add("b2")


def test_ids_are_forgotten_after_the_window() -> None:
    clock = ManualClock()
    ids = RecentIds(clock, window_s=10)
    ids.check_and_add("b1")
    clock.advance(10)
    assert not ids.check_and_add("b1")  # seen again, but long ago: delivered again
    assert len(ids) == 1


def test_the_set_is_bounded() -> None:
    ids = RecentIds(ManualClock(), window_s=1e9, max_entries=100)
    for i in range(1000):
        ids.check_and_add(f"b{i}")
    assert len(ids) == 100
    assert ids.check_and_add("b999")
    assert not ids.check_and_add("b0")


def test_recent_replies_answer_within_the_window_and_the_caps() -> None:
    clock = ManualClock()
    replies = RecentReplies(clock, window_s=10, max_entries=2)
    replies.put("a", ["u1", "u2", "u3"], ["u1", "u3"])
    assert replies.get("a", ["u1", "u2", "u3"]) == (["u1", "u3"], ["u2"])
    assert replies.get("b", ["u1"]) is None
    clock.advance(10 + REPLY_GRACE_S)
    assert replies.get("a", ["u1", "u2", "u3"]) is None  # past its window
    replies.put("b", ["x"], ["x"])
    replies.put("c", ["x"], [])
    replies.put("d", ["x", "y"], ["x", "y"])  # over the entry cap: the oldest goes
    assert replies.get("b", ["x"]) is None
    assert replies.get("c", ["x"]) == ([], ["x"])
    assert replies.get("d", ["x", "y"]) == (["x", "y"], [])
    assert len(replies) == 2


def test_recent_replies_keep_a_bitmap_within_a_byte_budget() -> None:
    clock = ManualClock()
    uids = [f"user-{i:04}" for i in range(1000)]
    half = uids[::2]
    replies = RecentReplies(clock, max_bytes=2000)
    replies.put("big", uids, half)
    assert replies.bytes < 500  # 125 bytes of bitmap (+ overhead), not 1000 uid strings
    assert replies.get("big", uids) == (half, uids[1::2])
    assert replies.get("big", uids[:8]) is None  # another uid list: not the same batch
    for i in range(10):
        replies.put(f"n{i}", uids, half)
    assert replies.bytes <= 2000 and len(replies) <= 2000 // (125 + ENTRY_OVERHEAD)
    assert replies.evicted_early > 0  # forgotten inside the window: counted
    assert replies.get("n9", uids) == (half, uids[1::2])


def amys_gateway(clock: ManualClock) -> tuple[DeliverService, ListSink]:
    """A gateway's deliver service with one connection, amy's, and what it was sent."""
    conns = LocalConnections()
    sink = ListSink()
    conns.add(ClientConn("amy", "c1", sink))
    return DeliverService(conns, clock, RecentIds(clock)), sink


def test_a_retry_gets_the_first_answer_even_after_its_ttl() -> None:
    clock = ManualClock()
    service, sink = amys_gateway(clock)
    message = gateway_pb2.Message(msg_id="m1", content_json=b"1")
    batch = gateway_pb2.Batch(
        batch_id="b1",
        message=message,
        uids=["amy", "bob"],
        mode=gateway_pb2.MODE_P2P,
        expires_ms=clock.now_ms() + 1000,
    )
    first = service.deliver(batch)
    assert (list(first.delivered), list(first.missing)) == (["amy"], ["bob"])
    clock.advance(1.5)  # the push's ttl has passed by the time the retry arrives
    again = service.deliver(batch)
    assert again.duplicate and not again.expired
    assert (list(again.delivered), list(again.missing)) == (["amy"], ["bob"])
    assert len(sink.frames) == 1  # written once
    late = gateway_pb2.Batch(batch_id="b2", message=message, uids=["amy"],
                             mode=gateway_pb2.MODE_P2P, expires_ms=clock.now_ms() - 1)  # fmt: skip
    assert service.deliver(late).expired and len(sink.frames) == 1


def test_a_reply_is_kept_until_its_batch_expires_and_a_grace_after() -> None:
    clock = ManualClock()
    replies = RecentReplies(clock, window_s=60)
    replies.put("short", ["u"], ["u"], expires_in_s=2.0)
    replies.put("none", ["u"], ["u"])  # no expiry: the whole window
    clock.advance(2.0 + REPLY_GRACE_S - 0.01)
    assert replies.seen("short") and replies.get("short", ["u"]) == (["u"], [])
    clock.advance(0.02)
    assert not replies.seen("short") and replies.get("short", ["u"]) is None
    assert replies.seen("none")
    clock.advance(60)
    assert not replies.seen("none")
    assert replies.evicted_early == 0


def test_the_bus_ids_are_bounded_in_bytes_and_count_early_evictions() -> None:
    ids = RecentIds(ManualClock(), window_s=600, max_bytes=10 * (8 + ENTRY_OVERHEAD))
    for i in range(20):
        ids.check_and_add(f"bus-{i:04}")
    assert len(ids) == 10 and ids.bytes <= 10 * (8 + ENTRY_OVERHEAD)
    assert ids.evicted_early == 10


def _batch(bid: str, mode: int, uids: list[str]) -> gateway_pb2.Batch:
    message = gateway_pb2.Message(msg_id="m-" + bid, content_json=b"1")
    return gateway_pb2.Batch(batch_id=bid, message=message, uids=uids, mode=mode)


def test_p2p_load_does_not_push_bus_ids_out() -> None:
    """The finding: P2P and bus batches shared one set of 200k ids, so 5k P2P batches/s
    shrank the bus's 10-minute window to 40 s, and a late bus redelivery was written twice."""
    clock = ManualClock()
    service, sink = amys_gateway(clock)
    bus = _batch("bus-1", gateway_pb2.MODE_BROADCAST, ["amy"])
    service.deliver(bus)
    for second in range(60):  # a minute at 5k P2P batches/s, each expiring in 2 s
        for n in range(5000):
            p2p = _batch(f"p{second}-{n}", gateway_pb2.MODE_P2P, ["nobody"])
            p2p.expires_ms = clock.now_ms() + 2000
            service.deliver(p2p)
        clock.advance(1.0)
    frames = len(sink.frames)
    assert service.deliver(bus).duplicate  # the bus redelivery, a minute later
    assert len(sink.frames) == frames == 1
    assert service.evicted_early == 0
    assert len(service._replies) < 40_000  # only what has not expired (plus the grace)


def test_a_p2p_batch_is_not_written_once_its_call_is_over() -> None:
    clock = ManualClock()
    service, sink = amys_gateway(clock)
    late = service.deliver(_batch("b1", gateway_pb2.MODE_P2P, ["amy"]), call_left_s=0.0)
    assert late.expired and not sink.frames
    fine = service.deliver(_batch("b2", gateway_pb2.MODE_P2P, ["amy"]), call_left_s=0.5)
    assert list(fine.delivered) == ["amy"] and len(sink.frames) == 1
    # Expired by the wall clock while the call has time left: counted as a clock skew.
    skewed = _batch("b3", gateway_pb2.MODE_P2P, ["amy"])
    skewed.expires_ms = clock.now_ms() - 5000
    assert service.deliver(skewed, call_left_s=1.5).expired
    assert service.skewed.total == 1 and len(sink.frames) == 1
