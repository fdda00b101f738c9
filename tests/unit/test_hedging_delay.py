"""The automatic hedge delay: a rolling p95 of attempt latencies, clamped to its range."""

from __future__ import annotations

import pytest

from router.hedging import AUTO, HedgeDelay, HedgingSettings


def test_auto_delay_follows_the_p95_within_the_range() -> None:
    delay = HedgeDelay(HedgingSettings(AUTO), ceiling_s=5.0, window=100, min_samples=10)
    assert delay.current() == 1.0  # Google's default until it has seen enough
    for i in range(100):
        delay.record(0.2 + i / 1000)  # 0.200 .. 0.299
    assert delay.current() == pytest.approx(0.295)
    for _ in range(100):
        delay.record(0.001)  # the window rolls over: everything fast now
    assert delay.current() == 0.1  # clamped to the minimum
    for _ in range(100):
        delay.record(30.0)
    assert delay.current() == pytest.approx(5.0 * 0.999)  # below the retry timeouts
