"""shared.backoff: exponential from the base, capped, with equal jitter (pure)."""

from __future__ import annotations

import pytest

from shared.backoff import backoff_s


def test_it_doubles_from_the_base_up_to_the_cap() -> None:
    waits = [backoff_s(n, 0.1, 1.0, rand=None) for n in range(1, 7)]
    assert waits == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_an_attempt_below_one_waits_the_base() -> None:
    assert backoff_s(0, 0.1, 1.0, rand=None) == pytest.approx(0.1)
    assert backoff_s(-3, 0.1, 1.0, rand=None) == pytest.approx(0.1)


def test_another_factor() -> None:
    assert backoff_s(3, 0.1, 5.0, factor=3.0, rand=None) == pytest.approx(0.9)
    assert backoff_s(9, 0.1, 5.0, factor=1.0, rand=None) == pytest.approx(0.1)


def test_equal_jitter_keeps_half_the_ceiling_as_a_floor() -> None:
    assert backoff_s(3, 0.1, 1.0, rand=lambda: 0.0) == pytest.approx(0.2)
    assert backoff_s(3, 0.1, 1.0, rand=lambda: 0.5) == pytest.approx(0.3)
    assert backoff_s(3, 0.1, 1.0, rand=lambda: 0.999) == pytest.approx(0.3998)
    assert backoff_s(50, 0.1, 1.0, rand=lambda: 0.0) == pytest.approx(0.5)


def test_a_huge_attempt_waits_the_cap() -> None:
    assert backoff_s(10**6, 0.1, 30.0, rand=None) == 30.0
    assert 15.0 <= backoff_s(10**6, 0.1, 30.0) <= 30.0


def test_the_default_draw_stays_in_range() -> None:
    for n in range(1, 20):
        ceiling = backoff_s(n, 0.05, 2.0, rand=None)
        assert ceiling / 2 <= backoff_s(n, 0.05, 2.0) <= ceiling


def test_redis_py_retries_wait_with_it() -> None:
    """The Redis clients' retries (redis-py counts failures from 1) wait 25-50 ms after
    the first failure, then double, up to 0.5 s: equal jitter, never 0."""
    from redis.asyncio.retry import Retry

    from router.redis.client import _BACKOFF

    for _ in range(200):
        assert 0.025 <= _BACKOFF.compute(1) <= 0.05
        assert 0.05 <= _BACKOFF.compute(2) <= 0.1
        assert 0.25 <= _BACKOFF.compute(30) <= 0.5
    assert Retry(_BACKOFF, 2).get_retries() == 2
