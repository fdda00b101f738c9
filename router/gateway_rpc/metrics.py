"""Prometheus metrics of the gateway calls `resilient.ResilientGatewayClient` makes."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["CallMetrics"]

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class CallMetrics:
    """Calls, retries, failures and latency per gateway (the push service's /metrics)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._seen: set[str] = set()  # gateways with series
        self._attempts = Counter(
            "imroute_gateway_call_attempts",
            "Delivery calls to a gateway (link or DeliverMany; one may carry many pushes), "
            "by outcome",
            ["gateway", "outcome"],
            registry=registry,
        )
        self._retries = Counter(
            "imroute_gateway_call_retries",
            "RPCs that were retries of an earlier failed one",
            ["gateway"],
            registry=registry,
        )
        self._failed = Counter(
            "imroute_gateway_calls_failed",
            "RPCs that failed for good (after retries, or refused by an open circuit)",
            ["gateway"],
            registry=registry,
        )
        self._latency = Histogram(
            "imroute_gateway_call_seconds",
            "Latency of successful delivery calls (link or DeliverMany)",
            ["gateway"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

    def retain(self, live: Mapping[str, str]) -> None:
        """Drop the series of gateways that left the fleet: gateway ids that change with
        every deploy (pod names) would otherwise grow /metrics without bound."""
        for gateway in self._seen - live.keys():
            self._seen.discard(gateway)
            for metric, labels in (
                (self._attempts, (gateway, "success")),
                (self._attempts, (gateway, "failure")),
                (self._retries, (gateway,)),
                (self._failed, (gateway,)),
                (self._latency, (gateway,)),
            ):
                with contextlib.suppress(KeyError):
                    metric.remove(*labels)

    def retried(self, gateway: str) -> None:
        """An attempt that retries an earlier failed one starts."""
        self._seen.add(gateway)
        self._retries.labels(gateway).inc()

    def attempt_failed(self, gateway: str) -> None:
        self._seen.add(gateway)
        self._attempts.labels(gateway, "failure").inc()

    def succeeded(self, gateway: str, elapsed_s: float) -> None:
        """The call's last attempt succeeded, after `elapsed_s`."""
        self._seen.add(gateway)
        self._attempts.labels(gateway, "success").inc()
        self._latency.labels(gateway).observe(elapsed_s)

    def failed(self, gateway: str) -> None:
        """The call failed for good (after its retries, or refused by an open circuit)."""
        self._seen.add(gateway)
        self._failed.labels(gateway).inc()
