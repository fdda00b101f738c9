"""P2P calls with per-gateway stats, circuit breaking and retries on the same gateway.

A P2P call must reach the gateway the user is connected to, so a failed call is retried
there (never on "the next server"), up to `max_retries_same` times with jittered backoff,
and only on a transport error (UNAVAILABLE: the call never reached the gateway or the
connection broke). A retry resends the same batch, whose batch id the gateway drops if
it already delivered it, so a retry after a lost answer does not deliver twice.

After `failure_threshold` consecutive failures a gateway's circuit opens: calls to it
fail at once for the cool-off, then one probe call decides whether it closes again. The
same StatsRegistry tells dispatch to skip the gateway meanwhile.

Each failed attempt and each failed call is logged (logger `imroute.calls`), and every
attempt is counted in `CallMetrics` (Prometheus series).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram

from router.balancing import RetryPolicy, StatsRegistry
from router.gateway_rpc.base import Batches, ManyGatewayClient, Replies
from shared.errors import GatewayUnavailable

__all__ = [
    "CIRCUIT_CODES",
    "CIRCUIT_OPEN",
    "TRANSPORT_CODES",
    "CallMetrics",
    "ResilientGatewayClient",
]

log = logging.getLogger("imroute.calls")

# Worth a retry on the same gateway: the call did not get through. DEADLINE_EXCEEDED is
# not: the push's time is spent.
TRANSPORT_CODES = frozenset({"UNAVAILABLE"})
# What counts against the circuit: the gateway could not be reached, or did not answer
# in time, or refuses our internal token (a gateway we cannot push to must not be given
# clients: dispatch skips an open circuit). An answer with another error
# (INVALID_ARGUMENT, UNIMPLEMENTED, INTERNAL) is not a sign the gateway is down.
CIRCUIT_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "UNAUTHENTICATED"})
# The least time an attempt is given (a retry is not tried with less left).
MIN_ATTEMPT_S = 0.005
# The code of the error a call refused by an open circuit raises.
CIRCUIT_OPEN = "CIRCUIT_OPEN"


class ResilientGatewayClient:
    """A ManyGatewayClient wrapper: circuit breaker, stats and same-gateway retries.

    It sits *below* the coalescer, so it sees RPCs, not pushes: a DeliverMany carrying
    50 pushes that fails is one failure for the circuit and one retry (of the whole
    call, with the same batch ids), not 50.
    """

    def __init__(
        self,
        inner: ManyGatewayClient,
        stats: StatsRegistry,
        policy: RetryPolicy,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        metrics: CallMetrics | None = None,
    ) -> None:
        self._inner = inner
        self.stats = stats
        self._policy = policy
        self._sleep = sleep
        # Without one given, the counts go to a registry of their own, which nobody reads.
        self._metrics = metrics or CallMetrics(CollectorRegistry())

    async def deliver_many(
        self, gateway_id: str, address: str, batches: Batches, timeout_s: float
    ) -> Replies:
        """Attempts within one deadline (`timeout_s` from now, for all of them)."""
        clock = self.stats.clock
        deadline = clock.monotonic() + timeout_s
        metrics = self._metrics
        extra = {"gateway_id": gateway_id}
        retry = 0
        while True:
            ticket = self.stats.on_start(gateway_id)
            if ticket is None:
                error = GatewayUnavailable(
                    gateway_id,
                    "circuit open: failing fast after repeated failures; "
                    "it is tried again after its cool-off",
                    CIRCUIT_OPEN,
                )
                # The opening was logged once; a line per refused call would flood the
                # log while the gateway is out.
                log.debug("call to gateway %s refused: %s", gateway_id, error, extra=extra)
                metrics.failed(gateway_id)
                raise error
            attempt_started = clock.monotonic()
            try:
                if retry:  # inside the try: whatever it raises, the ticket is released
                    metrics.retried(gateway_id)
                left = max(deadline - attempt_started, MIN_ATTEMPT_S)
                replies = await self._inner.deliver_many(gateway_id, address, batches, left)
            except GatewayUnavailable as exc:
                if exc.code in CIRCUIT_CODES:
                    self.stats.on_failure(ticket)
                else:  # the gateway answered: a refusal or a bug, not a sign it is down
                    self.stats.on_release(ticket)
                log.info(
                    "call to gateway %s failed (attempt %d): %s",
                    gateway_id,
                    retry + 1,
                    exc,
                    extra=extra,
                )
                metrics.attempt_failed(gateway_id)
                backoff = self._policy.backoff(retry + 1)
                if (
                    exc.code not in TRANSPORT_CODES
                    or retry >= self._policy.max_retries_same
                    # no time left for the backoff and a useful attempt after it
                    or deadline - clock.monotonic() < backoff + MIN_ATTEMPT_S
                    # the circuit opened (maybe on this failure): the retry would be
                    # refused; report the failure itself, not the refusal
                    or not self.stats.allow(gateway_id)
                ):
                    log.warning(
                        "delivery to gateway %s failed after %d attempts: %s",
                        gateway_id,
                        retry + 1,
                        exc,
                        extra=extra,
                    )
                    metrics.failed(gateway_id)
                    raise
            except BaseException:
                self.stats.on_release(ticket)  # cancelled, or not the gateway's fault
                raise
            else:
                self.stats.on_success(ticket)
                metrics.succeeded(gateway_id, clock.monotonic() - attempt_started)
                return replies
            retry += 1
            await self._sleep(backoff)

    def retain(self, live: Mapping[str, str]) -> None:
        """Forget the stats, circuits and channels of gateways that left the fleet (a
        gateway that comes back starts with a closed circuit and fresh stats)."""
        self.stats.retain(frozenset(live))
        self._inner.retain(live)

    async def close(self) -> None:
        await self._inner.close()


LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class CallMetrics:
    """Calls, retries, failures and latency per gateway, as `ResilientGatewayClient` makes
    them (the push service's /metrics)."""

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
