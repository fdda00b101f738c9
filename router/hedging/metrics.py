"""Prometheus metrics of publishing, per topic: a HedgeObserver."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["PublishMetrics"]

# Publish latency: from the publish call to its first success, hedges included.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class PublishMetrics:
    """What the hedged publisher does, per topic; `/metrics` of the publishing process."""

    def __init__(self, registry: CollectorRegistry) -> None:
        # The same counts over every topic, as plain numbers (router.stats samples them).
        self.publishes = 0
        self.hedges = 0
        self.hedge_wins = 0
        self._attempts = Counter(
            "imroute_bus_publish_attempts",
            "Publish attempts sent, by topic and kind (original, including its retries, or hedge)",
            ["topic", "kind"],
            registry=registry,
        )
        self._hedges = Counter(
            "imroute_bus_hedges_sent", "Hedged publish attempts sent", ["topic"],
            registry=registry,
        )  # fmt: skip
        self._wins = Counter(
            "imroute_bus_hedge_wins",
            "Publishes whose first success was a hedge",
            ["topic"],
            registry=registry,
        )
        self._cancelled = Counter(
            "imroute_bus_cancelled_attempts",
            "Attempts cancelled because another one succeeded first",
            ["topic"],
            registry=registry,
        )
        self._tokens = Gauge(
            "imroute_bus_hedge_tokens",
            "Hedging tokens available",
            ["topic"],
            registry=registry,
        )
        self._latency = Histogram(
            "imroute_bus_publish_seconds",
            "Publish latency, from the call to the first successful attempt",
            ["topic"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

    def attempt(self, topic: str, hedge: bool) -> None:
        self.publishes += 1
        self._attempts.labels(topic, "hedge" if hedge else "original").inc()
        if hedge:
            self.hedges += 1
            self._hedges.labels(topic).inc()

    def hedge_won(self, topic: str) -> None:
        self.hedge_wins += 1
        self._wins.labels(topic).inc()

    def cancelled(self, topic: str, n: int) -> None:
        self._cancelled.labels(topic).inc(n)

    def tokens(self, topic: str, value: float) -> None:
        self._tokens.labels(topic).set(value)

    def latency(self, topic: str, seconds: float) -> None:
        self._latency.labels(topic).observe(seconds)
