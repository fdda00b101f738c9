"""shared.gc_policy on the real collector: a freeze hides objects from it, reference
counting still frees them, and a cycle frozen with them waits for the full collection."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from shared.gc_policy import Freezer


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_frozen_cycle_waits_for_the_full_collection() -> None:
    freezer = Freezer(freeze_s=30, full_s=900)
    a, b = Node(), Node()
    a.other, b.other = b, a  # a reference cycle, as a closed connection may leave
    plain = Node()
    cycle, alone = weakref.ref(a), weakref.ref(plain)
    before = gc.get_freeze_count()
    assert freezer.step(since_full_s=30) is False
    assert gc.get_freeze_count() > before
    del a, b, plain
    assert alone() is None  # frozen, and still freed by reference counting
    gc.collect()
    assert cycle() is not None  # frozen: no collection sees the cycle
    assert freezer.step(since_full_s=899) is False
    assert cycle() is not None
    assert freezer.step(since_full_s=900) is True  # unfreeze, collect, freeze again
    assert cycle() is None
    assert (freezer.freezes, freezer.full_collections) == (3, 1)
    assert gc.get_freeze_count() > 0


def test_full_s_0_never_unfreezes() -> None:
    freezer = Freezer(freeze_s=30, full_s=0)
    a = Node()
    a.other = a
    cycle = weakref.ref(a)
    freezer.step(since_full_s=0)
    del a
    assert freezer.step(since_full_s=10**9) is False
    gc.collect()
    assert cycle() is not None and freezer.full_collections == 0
