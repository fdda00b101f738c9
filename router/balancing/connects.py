"""Clients' connects as dispatch learns from them (pure, on an injected clock).

A client that could not open its WebSocket on a gateway asks dispatch again with
`?avoid=<gateway_id>`. Each such report is a failed connect against that gateway; each
WebSocket a gateway accepts is a successful one. Both are counted fleet-wide in the
dashboard's per-interval counts (`router.stats`: fields `connect_failures:<id>` and
`connects:<id>`), a field more in writes made anyway. A gateway with at least
`min_failures` failed connects over the last `window_s`, and more than `ratio` times
its successful ones, is *failing*: dispatch places no one there while another gateway
can take the client, until the reports age out of the window or connects succeed again.
(A gateway that clients cannot reach still heartbeats, so its record looks healthy, and,
having lost its clients, it looks the least loaded: only the clients can tell.)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shared.clock import Clock
from shared.errors import ConfigError

__all__ = [
    "CONNECTS",
    "CONNECT_FAILURES",
    "ConnectReports",
    "ConnectSettings",
    "failing",
]

# Count names in the fleet's per-interval counts, followed by the gateway id.
CONNECTS = "connects:"
CONNECT_FAILURES = "connect_failures:"
# (uid, gateway) pairs remembered per window to count each user once; past it, reports
# are counted without that check (a large cut must still be learnt from).
MAX_REMEMBERED = 100_000


@dataclass(frozen=True, slots=True)
class ConnectSettings:
    """When dispatch skips a gateway that clients report they cannot connect to."""

    window_s: float = 30.0  # the failed and successful connects looked at
    min_failures: int = 5  # fewer failed connects in the window never skip (0: never)
    ratio: float = 1.0  # skipped when failed > ratio * successful connects in the window

    def __post_init__(self) -> None:
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ConfigError(f"window_s: {self.window_s!r} is not a positive number")
        n = self.min_failures
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"min_failures: {n!r} is not a whole number >= 0")
        if not (math.isfinite(self.ratio) and self.ratio >= 0):
            raise ConfigError(f"ratio: {self.ratio!r} is not a number >= 0")


def failing(
    counts: Mapping[str, int], gateway_ids: Iterable[str], settings: ConnectSettings
) -> frozenset[str]:
    """The gateways of `gateway_ids` that `counts` (the window's summed counts) shows
    failing: at least `min_failures` failed connects, and more than `ratio` times as
    many as the successful ones."""
    if settings.min_failures == 0:
        return frozenset()
    out = []
    for gateway_id in gateway_ids:
        failed = counts.get(CONNECT_FAILURES + gateway_id, 0)
        if failed >= settings.min_failures and failed > settings.ratio * counts.get(
            CONNECTS + gateway_id, 0
        ):
            out.append(gateway_id)
    return frozenset(out)


class ConnectReports:
    """This process's count of failed connects per gateway (cumulative, read by its stats
    sampler), each user counted once per gateway per window: one client asking again and
    again cannot take a gateway out of dispatch by itself."""

    def __init__(self, clock: Clock, window_s: float) -> None:
        self._clock = clock
        self._window_ms = max(1, int(window_s * 1000))
        self._period = -1
        self._seen: set[tuple[str, str]] = set()
        self.failed: Counter[str] = Counter()

    def report(self, uid: str, gateway_ids: Iterable[str]) -> list[str]:
        """Count `uid`'s failed connects to `gateway_ids`; the ones that counted."""
        period = self._clock.now_ms() // self._window_ms
        if period != self._period:
            self._period, self._seen = period, set()
        counted = []
        for gateway_id in gateway_ids:
            pair = (uid, gateway_id)
            if pair in self._seen:
                continue
            if len(self._seen) < MAX_REMEMBERED:
                self._seen.add(pair)
            self.failed[gateway_id] += 1
            counted.append(gateway_id)
        return counted

    def counts(self) -> dict[str, int]:
        """The stats sampler's view: `connect_failures:<id>` -> failed connects so far."""
        return {CONNECT_FAILURES + g: n for g, n in self.failed.items()}

    def retain(self, gateway_ids: Iterable[str]) -> None:
        """Forget the gateways not in `gateway_ids` (the live fleet)."""
        keep = set(gateway_ids)
        for gateway_id in [g for g in self.failed if g not in keep]:
            del self.failed[gateway_id]
