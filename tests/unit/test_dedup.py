from __future__ import annotations

from router.testing import ManualClock
from shared.proto import gateway_pb2
from socket_gateway.connections import ClientConn, LocalConnections
from socket_gateway.dedup import RecentIds, RecentReplies
from socket_gateway.delivery import DeliverService
from tests.unit.test_connections import ListSink


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
    clock.advance(10)
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
    assert replies.bytes <= 2000 and len(replies) < 5
    assert replies.get("n9", uids) == (half, uids[1::2])


def test_a_retry_gets_the_first_answer_even_after_its_ttl() -> None:
    clock = ManualClock()
    conns = LocalConnections()
    sink = ListSink()
    conns.add(ClientConn("amy", "c1", sink))
    service = DeliverService(conns, clock, RecentIds(clock))
    batch = gateway_pb2.Batch(
        batch_id="b1",
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
    late = gateway_pb2.Batch(batch_id="b2", uids=["amy"], mode=gateway_pb2.MODE_P2P,
                             expires_ms=clock.now_ms() - 1)  # fmt: skip
    assert service.deliver(late).expired and len(sink.frames) == 1
