"""Load shedding: a saturated push service answers 503 at once, with `Retry-After`, rather
than queueing work for callers that will have given up by the time it is done.

One process (each worker) decides for itself, from what it can see, in a pure-ASGI gate
outside every other, before a request's body is read:

- **In flight.** At most `IMROUTE_HTTP_MAX_IN_FLIGHT` requests are handled at once; the
  next is answered 503 `overloaded`. A bound on concurrency is a bound on the queue
  inside the process: past it, more requests only make each slower (they share one event
  loop, one Redis pool and the gateways' calls) until every caller times out.
- **Event-loop lag.** A small task sleeps `LAG_EVERY_S` and measures how late it wakes;
  the lag is smoothed (an EWMA of a third, as Node's toobusy does) and a wake-up that is
  overdue right now counts at once. While it is over `IMROUTE_HTTP_MAX_LAG_MS` and at
  least `LAG_MIN_IN_FLIGHT` requests are in flight, new ones are 503: the process is
  CPU-bound, and every request it admits waits behind the others. With few requests in
  flight a stall is not overload (a collection, one large body parsed) and sheds nothing.

The operator's requests are never shed nor counted: health, metrics, the dashboard and
the reads behind it, the fleet list, drains and the docs. So /healthz and the dashboard
answer while the API sheds (before shedding, the operator's own views timed out with
the API). A shed request did nothing, so a retry (with its `Idempotency-Key`) is safe.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Receive, Scope, Send

from push_service.errors import large_body, send_error
from shared.periodic import Periodic
from shared.throttled import Throttled

__all__ = ["LAG_EVERY_S", "LoadShed", "LoopLag", "Shedder", "is_operator"]

log = logging.getLogger(__name__)

LAG_EVERY_S = 0.05
LAG_SMOOTHING = 1 / 3
LAG_MIN_IN_FLIGHT = 8
RETRY_AFTER_S = 1
IN_FLIGHT = "in_flight"
LAG = "lag"

_OPERATOR_PATHS = frozenset({"/healthz", "/metrics", "/docs", "/openapi.json", "/v1/gateways"})
_OPERATOR_PREFIXES = ("/dashboard", "/client/", "/docs/", "/v1/admin/")


def is_operator(method: str, path: str) -> bool:
    """Whether a request is the operator's: never shed, never counted."""
    if method == "POST":  # a drain: the operator's way out of an overloaded gateway
        return path.startswith("/v1/gateways/") and path.endswith("/drain")
    if method not in ("GET", "HEAD"):
        return False
    return path in _OPERATOR_PATHS or path.startswith(_OPERATOR_PREFIXES)


class LoopLag:
    """How far behind its event loop this process runs, in seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.smoothed_s = 0.0
        self._clock = clock
        self.due: float | None = None  # when the measuring task should wake next

    def measured(self, lag_s: float) -> None:
        self.smoothed_s += LAG_SMOOTHING * (max(0.0, lag_s) - self.smoothed_s)

    def now_s(self) -> float:
        """The smoothed lag, or the measuring task's lateness now if that is more."""
        overdue = 0.0 if self.due is None else self._clock() - self.due
        return max(self.smoothed_s, overdue)

    def measuring(self, every_s: float = LAG_EVERY_S) -> Periodic:
        """The measuring task: a wake-up every `every_s`, how late it came measured."""

        async def woke() -> None:
            if self.due is not None:
                self.measured(self._clock() - self.due)
            self.due = self._clock() + every_s

        self.due = self._clock() + every_s
        return Periodic("loop lag", woke, every_s, log=log, at_once=False)


class Shedder:
    """The decision and its counts (pure: the gate and the lag task feed it)."""

    def __init__(self, max_in_flight: int, max_lag_ms: int, lag: LoopLag | None = None) -> None:
        self.max_in_flight = max_in_flight
        self.max_lag_s = max_lag_ms / 1000
        self.lag = lag or LoopLag()
        self.in_flight = 0
        self.shed = {IN_FLIGHT: 0, LAG: 0}
        self.shed_line = Throttled()  # an overload is one line per 10 s, with the count since

    def refuse(self) -> str | None:
        """Why a new request must be shed now (IN_FLIGHT or LAG), or None to admit it."""
        if self.in_flight >= self.max_in_flight:
            return IN_FLIGHT
        if (
            self.max_lag_s > 0
            and self.in_flight >= LAG_MIN_IN_FLIGHT
            and self.lag.now_s() > self.max_lag_s
        ):
            return LAG
        return None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The lag measured while the block runs (off with IMROUTE_HTTP_MAX_LAG_MS=0)."""
        if self.max_lag_s <= 0:
            yield
            return
        async with self.lag.measuring():
            yield

    def describe(self, reason: str) -> str:
        if reason == IN_FLIGHT:
            return (
                f"overloaded: {self.in_flight} requests in flight in this process "
                f"(IMROUTE_HTTP_MAX_IN_FLIGHT); nothing was done, retry in {RETRY_AFTER_S} s"
            )
        return (
            f"overloaded: the event loop runs {self.lag.now_s() * 1000:.0f} ms behind "
            f"(IMROUTE_HTTP_MAX_LAG_MS {self.max_lag_s * 1000:.0f}); nothing was done, "
            f"retry in {RETRY_AFTER_S} s"
        )


class ShedMetrics(Collector):
    def __init__(self, shedder: Shedder) -> None:
        self._shedder = shedder

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        shed = CounterMetricFamily(
            "imroute_http_shed",
            "Requests answered 503 overloaded, before any work, by reason",
            labels=["reason"],
        )
        for reason, n in self._shedder.shed.items():
            shed.add_metric([reason], n)
        yield shed
        yield GaugeMetricFamily(
            "imroute_http_in_flight",
            "Requests being handled (the operator's not counted)",
            self._shedder.in_flight,
        )
        yield GaugeMetricFamily(
            "imroute_event_loop_lag_seconds",
            "How far behind its event loop the process runs (smoothed)",
            self._shedder.lag.now_s(),
        )


class LoadShed:
    """The gate: 503 overloaded with Retry-After for what the Shedder refuses."""

    def __init__(self, app: ASGIApp, shedder: Shedder) -> None:
        self.app = app
        self.shedder = shedder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_operator(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        shedder = self.shedder
        reason = shedder.refuse()
        if reason is not None:
            shedder.shed[reason] += 1
            if since := shedder.shed_line.note(time.monotonic()):
                log.warning(
                    "%d requests shed (503 overloaded) since the last line; in all: %s",
                    since,
                    shedder.shed,
                )
            headers = [(b"retry-after", str(RETRY_AFTER_S).encode())]
            if large_body(scope["headers"]):
                # A small body the server skips and the connection is kept: under
                # overload, callers reconnecting after every 503 would cost more.
                headers.append((b"connection", b"close"))
            await send_error(send, 503, "overloaded", shedder.describe(reason), headers)
            return
        shedder.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            shedder.in_flight -= 1
