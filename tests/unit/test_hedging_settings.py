"""Hedging and retry settings: Google's ranges and defaults, and what cannot go together."""

from __future__ import annotations

from typing import Any

import pytest

from router.hedging import AUTO, Hedger, HedgingSettings, RetrySettings
from router.testing import ManualClock


def test_defaults_are_googles() -> None:
    s = HedgingSettings()
    assert (s.hedge_delay, s.max_tokens, s.refill_ratio) == (1.0, 50, 0.1)


@pytest.mark.parametrize(
    ("kwargs", "field", "allowed"),
    [
        ({"hedge_delay": 0.099}, "hedge_delay", "100 ms to 10 s"),
        ({"hedge_delay": 10.5}, "hedge_delay", "100 ms to 10 s"),
        ({"max_tokens": 0}, "max_tokens", "1 to 250"),
        ({"max_tokens": 251}, "max_tokens", "1 to 250"),
        ({"refill_ratio": 0.0009}, "refill_ratio", "0.001 to 0.2"),
        ({"refill_ratio": 0.21}, "refill_ratio", "0.001 to 0.2"),
    ],
)
def test_out_of_range_settings_name_the_field_and_range(
    kwargs: dict[str, Any], field: str, allowed: str
) -> None:
    with pytest.raises(ValueError, match=field) as info:
        HedgingSettings(**kwargs)
    assert allowed in str(info.value)


@pytest.mark.parametrize("value", ["fast", True, None])
def test_a_delay_must_be_seconds_or_auto(value: Any) -> None:
    with pytest.raises(ValueError, match="hedge_delay"):
        HedgingSettings(hedge_delay=value)
    assert HedgingSettings(hedge_delay=AUTO).auto


def test_the_edges_of_each_range_are_allowed() -> None:
    HedgingSettings(0.1, 1, 0.001)
    HedgingSettings(10.0, 250, 0.2)


def test_hedge_delay_must_be_below_both_retry_timeouts(clock: ManualClock) -> None:
    with pytest.raises(ValueError, match="initial_rpc_timeout_s"):
        Hedger(HedgingSettings(2.0), RetrySettings(initial_rpc_timeout_s=2.0), clock, bool)
    with pytest.raises(ValueError, match="total_timeout_s"):
        Hedger(
            HedgingSettings(2.0),
            RetrySettings(initial_rpc_timeout_s=5, max_rpc_timeout_s=5, total_timeout_s=1.5),
            clock,
            bool,
        )
    Hedger(HedgingSettings(1.9), RetrySettings(initial_rpc_timeout_s=2.0), clock, bool)


def test_hedging_and_ordering_keys_do_not_mix(clock: ManualClock) -> None:
    with pytest.raises(ValueError, match="ordering"):
        Hedger(HedgingSettings(), RetrySettings(), clock, bool, message_ordering=True)
    Hedger(None, RetrySettings(), clock, bool, message_ordering=True)  # no hedging: fine
