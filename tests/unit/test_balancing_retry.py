"""RetryPolicy: how often a pinned call is retried on its gateway, and the backoff."""

from __future__ import annotations

import random

import pytest

from router.balancing import RetryPolicy
from shared.errors import ConfigError


def no_jitter(same: int, *, backoff: float = 0.05, cap: float = 1.0) -> RetryPolicy:
    return RetryPolicy(same, backoff, cap, jitter=lambda: 0.0)


def test_backoff_doubles_per_retry_up_to_the_cap() -> None:
    policy = no_jitter(10, backoff=0.1, cap=0.5)
    delays = [policy.backoff(n) for n in range(1, 6)]
    # jitter 0 gives the lower bound: half of 0.1, 0.2, 0.4, 0.5 (capped), 0.5
    assert delays == pytest.approx([0.05, 0.1, 0.2, 0.25, 0.25])


def test_backoff_jitter_stays_within_half_and_all_of_the_backoff() -> None:
    top = RetryPolicy(5, 0.1, 1.0, jitter=lambda: 0.999999)
    assert top.backoff(1) == pytest.approx(0.1, rel=1e-5)
    assert top.backoff(10) == pytest.approx(1.0, rel=1e-5)
    rng = random.Random(7)
    policy = RetryPolicy(5, 0.1, 1.0, jitter=rng.random)
    for retry, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (60, 1.0)]:
        samples = [policy.backoff(retry) for _ in range(500)]
        assert all(ceiling / 2 <= d < ceiling for d in samples)
        assert max(samples) - min(samples) > ceiling / 4  # it does vary


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"max_retries_same": -1}, "max_retries_same"),
        ({"max_retries_same": 1.5}, "max_retries_same"),
        ({"backoff_s": -0.1}, "backoff_s"),
        ({"backoff_s": 2.0, "max_backoff_s": 1.0}, "max_backoff_s"),
        ({"max_backoff_s": float("inf")}, "max_backoff_s"),
    ],
)
def test_bad_policies_name_the_setting(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
