"""Built-in listeners of gateway calls: Prometheus metrics and structured logs."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram

from router.balancing import AttemptInfo, ExecutionContext

__all__ = ["CallLog", "CallMetrics"]

log = logging.getLogger("imroute.calls")

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class CallMetrics:
    """Calls, retries, failures and latency per gateway (the push service's /metrics)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._seen: set[str] = set()  # gateways with series
        self._attempts = Counter(
            "imroute_gateway_call_attempts",
            "Deliver/DeliverMany RPCs to a gateway (one may carry many pushes), by outcome",
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
            "Latency of successful Deliver/DeliverMany RPCs",
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

    def on_execution_start(self, ctx: ExecutionContext) -> None:
        if ctx.pinned is not None:
            self._seen.add(ctx.pinned)

    def on_start_with_server(self, ctx: ExecutionContext, attempt: AttemptInfo) -> None:
        if attempt.number > 1:
            self._retries.labels(attempt.server.gateway_id).inc()

    def on_exception_with_server(
        self, ctx: ExecutionContext, attempt: AttemptInfo, error: BaseException
    ) -> None:
        self._attempts.labels(attempt.server.gateway_id, "failure").inc()

    def on_execution_success(
        self, ctx: ExecutionContext, attempt: AttemptInfo, result: object
    ) -> None:
        gateway = attempt.server.gateway_id
        self._attempts.labels(gateway, "success").inc()
        elapsed = ctx.attributes.get("elapsed_s")
        if isinstance(elapsed, float):
            self._latency.labels(gateway).observe(elapsed)

    def on_execution_failed(
        self, ctx: ExecutionContext, attempt: AttemptInfo | None, error: BaseException
    ) -> None:
        gateway = ctx.pinned or (attempt.server.gateway_id if attempt else "?")
        self._failed.labels(gateway).inc()


class CallLog:
    """One structured log line per failed attempt and per failed delivery."""

    def on_execution_start(self, ctx: ExecutionContext) -> None:
        pass

    def on_start_with_server(self, ctx: ExecutionContext, attempt: AttemptInfo) -> None:
        pass

    def on_exception_with_server(
        self, ctx: ExecutionContext, attempt: AttemptInfo, error: BaseException
    ) -> None:
        gateway_id = attempt.server.gateway_id
        log.info(
            "call to gateway %s failed (attempt %d): %s",
            gateway_id,
            attempt.number,
            error,
            extra={"gateway_id": gateway_id},
        )

    def on_execution_success(
        self, ctx: ExecutionContext, attempt: AttemptInfo, result: object
    ) -> None:
        pass

    def on_execution_failed(
        self, ctx: ExecutionContext, attempt: AttemptInfo | None, error: BaseException
    ) -> None:
        if attempt is None:
            # Refused by an open circuit: the opening was logged once; a line per
            # refused call would flood the log while the gateway is out.
            log.debug(
                "call to gateway %s refused: %s",
                ctx.pinned,
                error,
                extra={"gateway_id": ctx.pinned},
            )
            return
        log.warning(
            "delivery to gateway %s failed after %d attempts: %s",
            ctx.pinned,
            ctx.attempts,
            error,
            extra={"gateway_id": ctx.pinned},
        )
