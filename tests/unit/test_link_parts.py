"""The delivery link's pure parts: the framing, the tickets, the address's host, the
accept loop's pause after failures."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.gateway_rpc.client import RETRY_MAX_S, RETRY_S, host_of, retry_in
from shared.clock import ManualClock
from shared.errors import PayloadTooLarge
from shared.link_frames import FrameReader, frame
from socket_gateway import acceptor
from socket_gateway.link_server import MAX_TICKETS, Tickets


@given(st.lists(st.binary(max_size=300), max_size=20), st.lists(st.integers(1, 64), min_size=1))
def test_frames_come_out_whole_and_in_order_however_the_bytes_are_cut(
    payloads: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(frame(p) for p in payloads)
    reader = FrameReader(300)
    out: list[bytes] = []
    pos, n = 0, 0
    while pos < len(stream):
        size = cuts[n % len(cuts)]
        out += reader.feed(stream[pos : pos + size])
        pos, n = pos + size, n + 1
    assert out == payloads
    assert reader.buffered == 0


def test_a_frame_over_the_limit_is_refused_by_its_header_alone() -> None:
    reader = FrameReader(100)
    assert reader.feed(frame(b"x" * 100)) == [b"x" * 100]
    with pytest.raises(PayloadTooLarge, match="101 bytes, over the limit of 100"):
        reader.feed((101).to_bytes(4, "big"))
    reader = FrameReader(100)
    assert reader.feed(b"\x00\x00") == [] and reader.buffered == 2  # half a header waits


def test_a_ticket_is_good_once_and_not_after_it_expires() -> None:
    clock = ManualClock()
    tickets = Tickets(clock, ttl_s=10)
    a, b = tickets.issue(), tickets.issue()
    assert a != b and len(a) == 32
    assert tickets.redeem(a) and not tickets.redeem(a)
    assert not tickets.redeem(b"made up")
    clock.advance(10.5)
    assert not tickets.redeem(b)


def test_unused_tickets_are_capped_the_oldest_going_first() -> None:
    tickets = Tickets(ManualClock(), ttl_s=10)
    issued = [tickets.issue() for _ in range(MAX_TICKETS + 5)]
    assert not any(tickets.redeem(t) for t in issued[:5])
    assert all(tickets.redeem(t) for t in issued[5:])


@pytest.mark.parametrize(
    ("address", "host"),
    [("10.0.0.5:9101", "10.0.0.5"), ("[::1]:9101", "::1"), ("gw-1.svc:9101", "gw-1.svc")],
)
def test_the_host_of_a_grpc_address(address: str, host: str) -> None:
    assert host_of(address) == host


def test_a_link_that_cannot_be_opened_is_tried_less_and_less_often() -> None:
    waits = [retry_in(n) for n in range(1, 8)]
    assert waits == [RETRY_S, 2 * RETRY_S, 4 * RETRY_S, 8 * RETRY_S, RETRY_MAX_S, RETRY_MAX_S,
                     RETRY_MAX_S]  # fmt: skip
    assert retry_in(10_000) == RETRY_MAX_S


def test_the_accept_loop_pauses_longer_while_failures_repeat() -> None:
    pauses = [acceptor.retry_after(n) for n in range(1, 40)]
    assert pauses[0] == acceptor.RETRY_FIRST_S
    assert pauses == sorted(pauses) and pauses[1] == 2 * pauses[0]
    assert pauses[-1] == acceptor.RETRY_MAX_S
