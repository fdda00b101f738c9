"""BusLosses: per-gateway counts add up; a push's lost batches are taken once each."""

from __future__ import annotations

from router.bus.losses import BusLosses


def test_counts_per_gateway_and_batches_per_push_once() -> None:
    losses = BusLosses()
    losses.record("broadcast", {"gw1": 2}, [("p1", "b1"), ("p1", "b2")])
    losses.record("broadcast", {"gw1": 1, "gw2": 1}, [("p1", "b2"), ("p2", "b9")])
    assert losses.unread_trimmed == {("broadcast", "gw1"): 3, ("broadcast", "gw2"): 1}
    assert losses.take("p1") == 2  # b2 twice (a hedged duplicate) is one batch
    assert losses.take("p1") == 0
    losses.record("broadcast", {"gw1": 1}, [("p1", "b1"), ("p1", "b3")])
    assert losses.take("p1") == 1  # b1 was taken already: only b3 is new
    assert losses.take("p2") == 1
    assert losses.take("unknown") == 0
