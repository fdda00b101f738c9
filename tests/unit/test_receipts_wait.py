"""wait_ack_ms's polling, with an in-memory receipt and the real loop clock."""

from __future__ import annotations

import time
from collections.abc import Sequence

from router.receipts.base import ACKED, DELIVERED, split_acked
from router.receipts.wait import WAIT_POLL_MAX_S, poll_interval, wait_acks
from shared.clock import SystemClock


class Acks:
    """A receipt whose recipients ack at given times after the first read."""

    def __init__(self, at: dict[str, float]) -> None:
        self.at = at
        self.reads = 0
        self.began: float | None = None

    async def states(self, push_id: str, uids: Sequence[str]) -> dict[str, str]:
        now = time.monotonic()
        self.began = self.began or now
        self.reads += 1
        return {u: ACKED if now - self.began >= self.at.get(u, 1e9) else DELIVERED for u in uids}


def test_the_poll_is_quick_at_first_then_slows_down() -> None:
    assert poll_interval(0.0) == 0.01 and poll_interval(0.099) == 0.01
    assert poll_interval(0.1) == 0.025 and poll_interval(0.49) == 0.025
    assert poll_interval(0.5) == WAIT_POLL_MAX_S == poll_interval(9.0)


async def test_it_returns_soon_after_every_online_recipient_acked() -> None:
    acks = Acks({"a": 0.03, "b": 0.04})
    began = time.monotonic()
    states = await wait_acks(acks, "p", ["a", "b"], ["a", "b", "off"], 5.0, SystemClock())  # type: ignore[arg-type]
    took = time.monotonic() - began
    assert split_acked(["a", "b", "off"], states) == (["a", "b"], ["off"])
    assert took < 1.0 and acks.reads <= 12  # not at the 5 s deadline; a few reads


async def test_it_gives_up_at_the_deadline_with_what_it_read_last() -> None:
    acks = Acks({"a": 0.0})
    began = time.monotonic()
    states = await wait_acks(acks, "p", ["a", "quiet"], ["a", "quiet"], 0.3, SystemClock())  # type: ignore[arg-type]
    took = time.monotonic() - began
    assert split_acked(["a", "quiet"], states) == (["a"], ["quiet"])
    assert 0.29 <= took < 1.0
