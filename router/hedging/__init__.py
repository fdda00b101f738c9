"""Hedged publishing (Google Cloud Pub/Sub's publish hedging) for every bus transport."""

from __future__ import annotations

from router.hedging.delay import HedgeDelay
from router.hedging.hedger import Attempt, AttemptContext, HedgeObserver, Hedger, NullObserver
from router.hedging.settings import AUTO, HedgingSettings, RetrySettings, check_compatible
from router.hedging.tokens import MILLI, TokenBucket

__all__ = [
    "AUTO",
    "MILLI",
    "Attempt",
    "AttemptContext",
    "HedgeDelay",
    "HedgeObserver",
    "Hedger",
    "HedgingSettings",
    "NullObserver",
    "RetrySettings",
    "TokenBucket",
    "check_compatible",
]
