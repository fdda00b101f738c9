"""Ports for child servers are picked below the ephemeral range (router.processes.ports)."""

from __future__ import annotations

import socket

from router.processes.ports import _ephemeral_low, free_port, free_port_block, port_free


def test_a_free_port_is_below_the_ephemeral_range_and_binds() -> None:
    low = _ephemeral_low()
    ports = {free_port() for _ in range(20)}
    assert all(10_000 <= p < low for p in ports), (ports, low)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


def test_a_block_is_free_at_every_offset_and_a_bound_port_is_not() -> None:
    base = free_port_block([0, 1, 1001])
    assert base + 1001 < _ephemeral_low()
    assert all(port_free(base + o) for o in (0, 1, 1001))
    with socket.socket() as s:
        s.bind(("127.0.0.1", base))
        s.listen()
        assert not port_free(base)
