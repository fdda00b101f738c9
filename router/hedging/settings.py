"""Hedging and retry settings, validated when they are built (pure).

The ranges and defaults are Google Cloud Pub/Sub's documented publish-hedging settings
(cloud.google.com/pubsub/docs/publish-hedging): a hedge delay of 100 ms to 10 s
(1 s by default), 1 to 250 tokens (50), a refill ratio of 0.001 to 0.2 (0.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["AUTO", "HedgingSettings", "RetrySettings", "check_compatible"]

AUTO: Literal["auto"] = "auto"

DELAY_MIN_S, DELAY_MAX_S = 0.1, 10.0
TOKENS_MIN, TOKENS_MAX = 1, 250
RATIO_MIN, RATIO_MAX = 0.001, 0.2


@dataclass(frozen=True, slots=True)
class HedgingSettings:
    """Publish hedging; a publisher hedges only when it is given these.

    `hedge_delay` is seconds, or "auto": a rolling p95 of recent attempt latencies,
    clamped to the allowed range (and below the retry timeouts).
    """

    hedge_delay: float | Literal["auto"] = 1.0
    max_tokens: int = 50
    refill_ratio: float = 0.1

    def __post_init__(self) -> None:
        if self.hedge_delay != AUTO:
            delay = self.hedge_delay
            if isinstance(delay, bool) or not isinstance(delay, int | float):
                raise ValueError(f"hedge_delay: {delay!r} is neither seconds nor 'auto'")
            if not DELAY_MIN_S <= delay <= DELAY_MAX_S:
                raise ValueError(
                    f"hedge_delay: {delay * 1000:g} ms is outside the allowed range "
                    f"{DELAY_MIN_S * 1000:g} ms to {DELAY_MAX_S:g} s"
                )
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise ValueError(f"max_tokens: {self.max_tokens!r} is not a whole number")
        if not TOKENS_MIN <= self.max_tokens <= TOKENS_MAX:
            raise ValueError(
                f"max_tokens: {self.max_tokens} is outside the allowed range "
                f"{TOKENS_MIN} to {TOKENS_MAX}"
            )
        if not RATIO_MIN <= self.refill_ratio <= RATIO_MAX:
            raise ValueError(
                f"refill_ratio: {self.refill_ratio:g} is outside the allowed range "
                f"{RATIO_MIN:g} to {RATIO_MAX:g}"
            )

    @property
    def auto(self) -> bool:
        return self.hedge_delay == AUTO


@dataclass(frozen=True, slots=True)
class RetrySettings:
    """How the original publish attempt is retried (hedged attempts never are).

    Exponential backoff with jitter between attempts, only on retryable errors; each
    attempt's timeout grows from `initial_rpc_timeout_s` by `rpc_timeout_multiplier` up
    to `max_rpc_timeout_s`; nothing runs past `total_timeout_s` from the publish.
    """

    initial_rpc_timeout_s: float = 5.0
    rpc_timeout_multiplier: float = 2.0
    max_rpc_timeout_s: float = 30.0
    total_timeout_s: float = 60.0
    initial_backoff_s: float = 0.1
    backoff_multiplier: float = 2.0
    max_backoff_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("initial_rpc_timeout_s", "max_rpc_timeout_s", "total_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be more than 0 s")
        if self.max_rpc_timeout_s < self.initial_rpc_timeout_s:
            raise ValueError("max_rpc_timeout_s: must be at least initial_rpc_timeout_s")
        if self.initial_backoff_s < 0 or self.max_backoff_s < self.initial_backoff_s:
            raise ValueError("initial_backoff_s, max_backoff_s: need 0 <= initial <= max")
        if self.rpc_timeout_multiplier < 1 or self.backoff_multiplier < 1:
            raise ValueError("rpc_timeout_multiplier, backoff_multiplier: must be at least 1")


def check_compatible(
    hedging: HedgingSettings | None, retry: RetrySettings, *, message_ordering: bool
) -> None:
    """Refuse, as Google's clients do, hedging that could never fire or breaks ordering."""
    if hedging is None:
        return
    if message_ordering:
        raise ValueError(
            "hedging: cannot be enabled together with ordering keys (message ordering): "
            "a hedged duplicate could overtake the messages behind it"
        )
    if hedging.auto:
        return  # the automatic delay is clamped below both timeouts instead
    delay = float(hedging.hedge_delay)
    for name, limit in (
        ("initial_rpc_timeout_s", retry.initial_rpc_timeout_s),
        ("total_timeout_s", retry.total_timeout_s),
    ):
        if not delay < limit:
            raise ValueError(
                f"hedge_delay: {delay * 1000:g} ms must be less than the retry settings' "
                f"{name} ({limit * 1000:g} ms), or no hedge could ever be sent"
            )
