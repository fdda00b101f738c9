"""What the app holds with auto_ack off, and where each push lives now (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from imroute_client.acks import Held
from imroute_client.frames import Message


def msg(n: int, conn: int, number: int) -> Message:
    return Message(f"m{n}", f"p{n}", 0, "admin", n, 1, f"pos-{n}", conn=conn, number=number)


def test_a_held_push_s_copy_on_a_new_connection_takes_its_place() -> None:
    h = Held()
    h.handed(msg(1, 1, 1))
    h.handed(msg(2, 1, 2))
    assert not h.moved(msg(3, 2, 1))  # never held: a plain duplicate
    assert h.moved(msg(2, 2, 1))
    home = h.home("m2")
    assert home is not None and (home.conn, home.number) == (2, 1)
    assert h.home("m3") is None


def test_an_ack_forgets_what_it_covers_on_either_connection() -> None:
    h = Held()
    for n in range(1, 4):
        h.handed(msg(n, 1, n))
    h.moved(msg(2, 2, 1))
    h.moved(msg(3, 2, 2))
    # The app acks m3 as it got it (conn 1, number 3), whose copy is conn 2, number 2.
    h.acked(1, 3)
    assert h.home("m1") is None  # not sent again yet: done with, by the cumulative ack
    assert h.home("m2") is not None  # its copy lives on connection 2
    h.acked(2, 2)
    assert len(h) == 0


def test_past_its_size_the_oldest_is_forgotten() -> None:
    h = Held(2)
    assert not h.handed(msg(1, 1, 1))
    assert not h.handed(msg(2, 1, 2))
    assert h.handed(msg(3, 1, 3))
    assert h.home("m1") is None and len(h) == 2
    # Moving keeps a push's place in the order (the oldest still leaves first).
    h.moved(replace(msg(2, 2, 1)))
    assert h.handed(msg(4, 2, 2))
    assert h.home("m2") is None and h.home("m3") is not None
    with pytest.raises(ValueError, match="below 1"):
        Held(0)
