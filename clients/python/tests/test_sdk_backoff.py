"""Backoff and Retry-After."""

from __future__ import annotations

import pytest
from imroute_client.backoff import Backoff, retry_after


def test_delays_double_from_min_and_stop_at_max() -> None:
    b = Backoff(0.1, 5.0)
    mid = [b.delay(n, lambda: 0.5) for n in range(8)]  # jitter factor 1.0
    assert mid[:4] == pytest.approx([0.1, 0.2, 0.4, 0.8])
    assert mid[-1] == 5.0
    assert b.delay(10_000, lambda: 0.5) == 5.0  # no overflow


def test_jitter_spreads_within_half_to_one_and_a_half_and_never_past_max() -> None:
    b = Backoff(1.0, 3.0)
    assert b.delay(0, lambda: 0.0) == pytest.approx(0.5)
    assert b.delay(0, lambda: 0.999) == pytest.approx(1.499)
    assert b.delay(5, lambda: 0.999) == 3.0


@pytest.mark.parametrize(("lo", "hi"), [(0.0, 1.0), (2.0, 1.0), (-1.0, 1.0)])
def test_a_bad_range_is_refused(lo: float, hi: float) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(lo, hi)


def test_retry_after_is_clamped_and_jittered_upwards() -> None:
    b = Backoff(0.1, 5.0)
    assert retry_after("2", b, lambda: 0.0) == 2.0
    assert retry_after("2", b, lambda: 0.5) == pytest.approx(2.2)
    assert retry_after("120", b, lambda: 0.5) == 5.0
    assert retry_after("0", b, lambda: 0.0) == 0.1
    for junk in (None, "soon", "nan", "inf", "Wed, 21 Oct 2015 07:28:00 GMT"):
        assert retry_after(junk, b, lambda: 0.0) is None
