"""Retries of a balanced call (Ribbon's RetryHandler and LoadBalancerCommand), I/O-free.

`RetryPolicy.plan` is the pure part: from the gateways the failed attempts went to, it
says whether to try again, on the same gateway or the next one, and after what delay.
`execute` runs one call with a rule, the stats and circuit breakers, the policy and the
listeners; the call itself, the sleep and the clock are injected.

A P2P call is *pinned*: the user's connection lives on one gateway, so it is retried
only there. Any other call moves on: each gateway gets 1 + `max_retries_same` attempts,
and up to `max_retries_next` other gateways are tried after the first.
"""

from __future__ import annotations

import enum
import itertools
import math
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from router.balancing.listeners import AttemptInfo, ExecutionContext, Listeners
from router.balancing.rules import Rule
from router.balancing.servers import GatewayState
from router.balancing.stats import StatsRegistry, Ticket
from shared.errors import ConfigError, GatewayUnavailable

__all__ = ["Decision", "Move", "NoEligibleGateway", "RetryPolicy", "execute"]

T = TypeVar("T")


class NoEligibleGateway(GatewayUnavailable):
    """No gateway could take the call (none eligible, or every one's circuit open)."""

    def __init__(self, reason: str = "no eligible gateway") -> None:
        super().__init__("*", reason)


class Move(enum.Enum):
    SAME = "same"  # try the gateway that just failed again
    NEXT = "next"  # try another eligible gateway


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do after a failed attempt: `move` None means give up."""

    move: Move | None
    delay_s: float = 0.0

    @property
    def retry(self) -> bool:
        return self.move is not None


GIVE_UP = Decision(None)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many times a call is retried and how long it waits before each retry.

    The defaults are Ribbon's (MaxAutoRetries 0, MaxAutoRetriesNextServer 1). Retries on
    the same gateway back off exponentially from `backoff_s` up to `max_backoff_s`, with
    jitter: each wait is between half and all of that ("equal jitter"). Moving to another
    gateway waits nothing: the backoff is there to spare the gateway that failed.
    `jitter` returns a number in [0, 1).
    """

    max_retries_same: int = 0
    max_retries_next: int = 1
    backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    jitter: Callable[[], float] = field(default=random.random, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("max_retries_same", "max_retries_next"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name}: {value!r} is not a whole number >= 0")
        for name in ("backoff_s", "max_backoff_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name}: {value!r} is not a number of seconds >= 0")
        if self.max_backoff_s < self.backoff_s:
            raise ConfigError(
                f"max_backoff_s: {self.max_backoff_s:g} is below backoff_s {self.backoff_s:g}"
            )

    def max_attempts(self, *, pinned: bool) -> int:
        per_server = 1 + self.max_retries_same
        return per_server if pinned else per_server * (1 + self.max_retries_next)

    def backoff(self, retry: int) -> float:
        """The jittered wait before the `retry`-th retry (from 1) on the same gateway."""
        ceiling = min(self.backoff_s * 2.0 ** min(retry - 1, 64), self.max_backoff_s)
        return ceiling * (0.5 + 0.5 * self.jitter())

    def plan(
        self, failed_on: Sequence[str], *, pinned: bool, same_available: bool = True
    ) -> Decision:
        """After the attempts on `failed_on` (gateway ids, in order) all failed with transport
        errors: retry where, after how long, or give up. `same_available` is False when the
        last gateway's circuit refuses calls now."""
        if not failed_on:
            raise ValueError("plan() needs at least one failed attempt")
        last = failed_on[-1]
        on_last = 0
        for gateway_id in reversed(failed_on):
            if gateway_id != last:
                break
            on_last += 1
        if same_available and on_last <= self.max_retries_same:
            return Decision(Move.SAME, self.backoff(on_last))
        gateways_tried = 1 + sum(1 for a, b in itertools.pairwise(failed_on) if a != b)
        if not pinned and gateways_tried <= self.max_retries_next:
            return Decision(Move.NEXT, 0.0)
        return GIVE_UP


async def execute(
    call: Callable[[GatewayState], Awaitable[T]],
    *,
    servers: Sequence[GatewayState],
    rule: Rule,
    stats: StatsRegistry,
    policy: RetryPolicy,
    sleep: Callable[[float], Awaitable[None]],
    is_transport_error: Callable[[BaseException], bool],
    key: str | None = None,
    pinned: GatewayState | None = None,
    listeners: Listeners | None = None,
) -> T:
    """Run `call` on a gateway `rule` picks from `servers` (or on `pinned`), retrying
    transport errors as `policy` says; other errors end it at once.

    Every attempt is counted in `stats` and goes through its gateway's circuit breaker.
    Raises the last attempt's error when the retries run out, NoEligibleGateway when no
    gateway could take the first attempt, GatewayUnavailable when `pinned`'s circuit is
    open. A cancelled call leaves its gateway's stats as if it had never been made.
    """
    run = _Execution(servers, rule, stats, policy, key, pinned)
    fan_out = listeners or Listeners()
    ctx = ExecutionContext(key, pinned.gateway_id if pinned else None, stats.clock.monotonic())
    fan_out.on_execution_start(ctx)
    info: AttemptInfo | None = None
    while True:
        picked = run.next_attempt()
        if picked is None:
            error = run.no_gateway_error()
            fan_out.on_execution_failed(ctx, info, error)
            raise error
        server, ticket, on_server = picked
        ctx.attempts += 1
        info = AttemptInfo(server, ctx.attempts, on_server)
        fan_out.on_start_with_server(ctx, info)
        try:
            result = await call(server)
        except Exception as exc:
            fan_out.on_exception_with_server(ctx, info, exc)
            if not is_transport_error(exc):
                stats.on_release(ticket)  # the gateway answered: not its fault
                fan_out.on_execution_failed(ctx, info, exc)
                raise
            stats.on_failure(ticket)
            decision = run.failed(server, exc)
            if decision.move is None:
                fan_out.on_execution_failed(ctx, info, exc)
                raise
            if decision.delay_s > 0:
                await sleep(decision.delay_s)
            continue
        except BaseException:
            stats.on_release(ticket)  # cancelled: no verdict on the gateway
            raise
        stats.on_success(ticket)
        fan_out.on_execution_success(ctx, info, result)
        return result


class _Execution:
    """Where the attempts of one `execute` went, and where the next one goes."""

    def __init__(
        self,
        servers: Sequence[GatewayState],
        rule: Rule,
        stats: StatsRegistry,
        policy: RetryPolicy,
        key: str | None,
        pinned: GatewayState | None,
    ) -> None:
        self.servers = servers
        self.rule = rule
        self.stats = stats
        self.policy = policy
        self.key = key
        self.pinned = pinned
        self.server = pinned
        self.move = Move.SAME if pinned else Move.NEXT
        self.excluded: set[str] = set()  # gateways that failed, or whose circuit refused
        self.failed_on: list[str] = []
        self.last_error: BaseException | None = None
        self.on_server = 0

    def failed(self, server: GatewayState, error: BaseException) -> Decision:
        """Record a transport failure on `server`; what the policy says to do next."""
        self.last_error = error
        self.failed_on.append(server.gateway_id)
        self.excluded.add(server.gateway_id)
        decision = self.policy.plan(
            self.failed_on,
            pinned=self.pinned is not None,
            same_available=self.stats.allow(server.gateway_id),
        )
        if decision.move is not None:
            self.move = decision.move
        return decision

    def next_attempt(self) -> tuple[GatewayState, Ticket, int] | None:
        """The next attempt's gateway, its started ticket and the attempt's number on that
        gateway; None when no gateway can take it."""
        if self.move is Move.SAME and self.server is not None:
            ticket = self.stats.on_start(self.server.gateway_id)
            if ticket is not None:
                self.on_server += 1
                return self.server, ticket, self.on_server
            # The circuit opened (or its probe went to another call) during the backoff.
            if self.pinned is not None or not self.failed_on:
                return None
            if self.policy.plan(self.failed_on, pinned=False, same_available=False).move is None:
                return None
        while True:
            candidates = [s for s in self.servers if s.gateway_id not in self.excluded]
            chosen = self.rule.choose(candidates, self.key)
            if chosen is None:
                return None
            ticket = self.stats.on_start(chosen.gateway_id)
            if ticket is not None:
                self.server, self.move, self.on_server = chosen, Move.SAME, 1
                return chosen, ticket, 1
            # The rule's Availability may not know this registry's circuits: skip, re-pick.
            self.excluded.add(chosen.gateway_id)

    def no_gateway_error(self) -> BaseException:
        if self.last_error is not None:
            return self.last_error
        if self.pinned is not None:
            return GatewayUnavailable(self.pinned.gateway_id, "circuit open")
        return NoEligibleGateway()
