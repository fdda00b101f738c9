"""The retry planner, `execute` and the listeners: pure, ManualClock, nothing sleeps."""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field

import pytest

from router.balancing import (
    AttemptInfo,
    Availability,
    ExecutionContext,
    GatewayState,
    Listeners,
    Move,
    NoEligibleGateway,
    RetryPolicy,
    RoundRobinRule,
    StatsRegistry,
    StatsSettings,
    execute,
)
from shared.clock import ManualClock
from shared.errors import ConfigError, GatewayUnavailable

CLOCK_MS = ManualClock().now_ms()


class Transport(Exception):
    """Stands for a gateway that could not be reached (retryable)."""


class Refused(Exception):
    """Stands for an answer from the gateway (not retryable, not its fault)."""


def is_transport(exc: BaseException) -> bool:
    return isinstance(exc, Transport)


def gw(gateway_id: str) -> GatewayState:
    return GatewayState(
        gateway_id=gateway_id,
        group_id="g1",
        ws_url=f"ws://{gateway_id}/ws",
        grpc_address=f"{gateway_id}:9000",
        connections=0,
        max_connections=100,
        heartbeat_deadline_ms=CLOCK_MS + 60_000,
    )


SERVERS = [gw(f"gw{i}") for i in range(4)]


@dataclass
class Sleeps:
    """An injected sleep that records instead of waiting."""

    delays: list[float] = field(default_factory=list)

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@dataclass
class Gateways:
    """The call: fails on the listed gateways (a number of times, or always), else answers."""

    clock: ManualClock
    fail: dict[str, int] = field(default_factory=dict)  # -1: always
    error: type[Exception] = Transport
    latency_s: float = 0.0
    calls: list[str] = field(default_factory=list)

    async def __call__(self, server: GatewayState) -> str:
        self.calls.append(server.gateway_id)
        self.clock.advance(self.latency_s)
        left = self.fail.get(server.gateway_id, 0)
        if left:
            self.fail[server.gateway_id] = left - 1 if left > 0 else left
            raise self.error(server.gateway_id)
        return f"ok from {server.gateway_id}"


@dataclass
class Recorder:
    events: list[tuple[str, ...]] = field(default_factory=list)

    def on_execution_start(self, ctx: ExecutionContext) -> None:
        self.events.append(("start",))

    def on_start_with_server(self, ctx: ExecutionContext, attempt: AttemptInfo) -> None:
        self.events.append(
            (
                "server",
                attempt.server.gateway_id,
                str(attempt.number),
                str(attempt.number_on_server),
            )
        )

    def on_exception_with_server(
        self, ctx: ExecutionContext, attempt: AttemptInfo, error: BaseException
    ) -> None:
        self.events.append(("exception", attempt.server.gateway_id, type(error).__name__))

    def on_execution_success(
        self, ctx: ExecutionContext, attempt: AttemptInfo, result: object
    ) -> None:
        self.events.append(("success", attempt.server.gateway_id, str(result)))

    def on_execution_failed(
        self, ctx: ExecutionContext, attempt: AttemptInfo | None, error: BaseException
    ) -> None:
        where = attempt.server.gateway_id if attempt else "-"
        self.events.append(("failed", where, type(error).__name__))


class Raising:
    """A listener that raises in every hook."""

    def __init__(self) -> None:
        self.calls = 0

    def _boom(self, *args: object) -> None:
        self.calls += 1
        raise RuntimeError("listener bug")

    on_execution_start = _boom
    on_start_with_server = _boom
    on_exception_with_server = _boom
    on_execution_success = _boom
    on_execution_failed = _boom


@dataclass
class Setup:
    clock: ManualClock
    stats: StatsRegistry
    gateways: Gateways
    sleeps: Sleeps
    recorder: Recorder

    async def run(
        self,
        policy: RetryPolicy,
        *,
        pinned: GatewayState | None = None,
        servers: list[GatewayState] = SERVERS,
        extra: tuple[object, ...] = (),
    ) -> str:
        available = Availability(self.clock, self.stats)
        return await execute(
            self.gateways,
            servers=servers,
            rule=RoundRobinRule(available),
            stats=self.stats,
            policy=policy,
            sleep=self.sleeps,
            is_transport_error=is_transport,
            key="alice",
            pinned=pinned,
            listeners=Listeners([*extra, self.recorder]),  # type: ignore[list-item]
        )


@pytest.fixture
def s() -> Setup:
    clock = ManualClock(wall_ms=CLOCK_MS)
    stats = StatsRegistry(clock, StatsSettings(failure_threshold=100, ewma_alpha=0.5))
    return Setup(clock, stats, Gateways(clock), Sleeps(), Recorder())


# --- the planner ------------------------------------------------------------------------


def no_jitter(same: int, next_: int, backoff: float = 0.1, cap: float = 10.0) -> RetryPolicy:
    return RetryPolicy(same, next_, backoff, cap, jitter=lambda: 0.0)


def test_plan_pinned_retries_the_same_gateway_exactly_max_retries_same() -> None:
    policy = no_jitter(2, 5)
    assert policy.plan(["a"], pinned=True).move is Move.SAME
    assert policy.plan(["a", "a"], pinned=True).move is Move.SAME
    assert not policy.plan(["a", "a", "a"], pinned=True).retry  # next never applies
    assert policy.max_attempts(pinned=True) == 3


def test_plan_unpinned_goes_same_then_next_per_gateway() -> None:
    policy = no_jitter(1, 2)
    history: list[str] = []
    moves = []
    for gateway in ["a", "a", "b", "b", "c", "c"]:
        history.append(gateway)
        moves.append(policy.plan(history, pinned=False).move)
    assert moves == [Move.SAME, Move.NEXT, Move.SAME, Move.NEXT, Move.SAME, None]
    assert policy.max_attempts(pinned=False) == 6


def test_plan_moves_on_when_the_same_gateways_circuit_refuses() -> None:
    policy = no_jitter(3, 1)
    assert policy.plan(["a"], pinned=False, same_available=False).move is Move.NEXT
    assert not policy.plan(["a"], pinned=True, same_available=False).retry
    assert not policy.plan(["a", "b"], pinned=False, same_available=False).retry


def test_plan_with_no_retries_gives_up_at_once() -> None:
    assert not RetryPolicy(0, 0).plan(["a"], pinned=False).retry
    with pytest.raises(ValueError):
        RetryPolicy().plan([], pinned=False)


def test_backoff_doubles_per_retry_on_a_gateway_up_to_the_cap() -> None:
    policy = no_jitter(10, 0, backoff=0.1, cap=0.5)
    delays = [policy.plan(["a"] * n, pinned=True).delay_s for n in range(1, 6)]
    # jitter 0 gives the lower bound: half of 0.1, 0.2, 0.4, 0.5 (capped), 0.5
    assert delays == pytest.approx([0.05, 0.1, 0.2, 0.25, 0.25])
    assert policy.plan(["a", "b"], pinned=False, same_available=False).delay_s == 0.0
    # a new gateway starts from the initial backoff again
    assert no_jitter(2, 2).plan(["a", "a", "b"], pinned=False).delay_s == pytest.approx(0.05)


def test_backoff_jitter_stays_within_half_and_all_of_the_backoff() -> None:
    top = RetryPolicy(5, 0, 0.1, 1.0, jitter=lambda: 0.999999)
    assert top.backoff(1) == pytest.approx(0.1, rel=1e-5)
    assert top.backoff(10) == pytest.approx(1.0, rel=1e-5)
    rng = random.Random(7)
    policy = RetryPolicy(5, 0, 0.1, 1.0, jitter=rng.random)
    for retry, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (60, 1.0)]:
        samples = [policy.backoff(retry) for _ in range(500)]
        assert all(ceiling / 2 <= d < ceiling for d in samples)
        assert max(samples) - min(samples) > ceiling / 4  # it does vary


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"max_retries_same": -1}, "max_retries_same"),
        ({"max_retries_next": 1.5}, "max_retries_next"),
        ({"backoff_s": -0.1}, "backoff_s"),
        ({"backoff_s": 2.0, "max_backoff_s": 1.0}, "max_backoff_s"),
        ({"max_backoff_s": float("inf")}, "max_backoff_s"),
    ],
)
def test_bad_policies_name_the_setting(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


# --- execute ----------------------------------------------------------------------------


async def test_p2p_retries_only_its_gateway_exactly_as_configured(s: Setup) -> None:
    s.gateways.fail = {"gw2": -1}
    with pytest.raises(Transport):
        await s.run(RetryPolicy(2, 3, 0.1, 1.0), pinned=SERVERS[2])
    assert s.gateways.calls == ["gw2", "gw2", "gw2"]
    assert len(s.sleeps.delays) == 2
    assert 0.05 <= s.sleeps.delays[0] < 0.1 and 0.1 <= s.sleeps.delays[1] < 0.2
    assert s.stats.stats("gw2").failures == 3 and s.stats.in_flight("gw2") == 0


async def test_other_calls_move_to_the_next_gateway_exactly_as_configured(s: Setup) -> None:
    s.gateways.fail = {g.gateway_id: -1 for g in SERVERS}
    with pytest.raises(Transport):
        await s.run(RetryPolicy(0, 2))
    assert len(s.gateways.calls) == 3 and len(set(s.gateways.calls)) == 3
    assert s.sleeps.delays == []  # moving on waits nothing


async def test_same_then_next(s: Setup) -> None:
    s.gateways.fail = {g.gateway_id: -1 for g in SERVERS}
    with pytest.raises(Transport):
        await s.run(RetryPolicy(1, 1, 0.1, 1.0))
    a, b = s.gateways.calls[0], s.gateways.calls[2]
    assert s.gateways.calls == [a, a, b, b] and a != b
    assert len(s.sleeps.delays) == 2


async def test_a_retry_that_succeeds_returns_and_counts(s: Setup) -> None:
    s.gateways.fail = {"gw0": 1}
    s.gateways.latency_s = 0.5
    result = await s.run(RetryPolicy(0, 1))
    first, second = s.gateways.calls
    assert first == "gw0" and second != "gw0" and result == f"ok from {second}"
    assert (s.stats.stats("gw0").failures, s.stats.stats(second).successes) == (1, 1)
    assert s.stats.stats(second).latency_ewma_s == pytest.approx(0.5)
    assert s.stats.in_flight("gw0") == s.stats.in_flight(second) == 0


async def test_the_last_error_is_raised_when_no_other_gateway_is_left(s: Setup) -> None:
    s.gateways.fail = {"gw0": -1, "gw1": -1}
    with pytest.raises(Transport, match="gw1"):
        await s.run(RetryPolicy(0, 5), servers=SERVERS[:2])
    assert s.gateways.calls == ["gw0", "gw1"]


async def test_other_errors_are_not_retried_nor_held_against_the_gateway(s: Setup) -> None:
    s.gateways.fail = {"gw0": -1}
    s.gateways.error = Refused
    with pytest.raises(Refused):
        await s.run(RetryPolicy(3, 3))
    assert s.gateways.calls == ["gw0"]
    stats = s.stats.stats("gw0")
    assert (stats.failures, stats.successes, stats.in_flight) == (0, 0, 0)


async def test_no_eligible_gateway(s: Setup) -> None:
    with pytest.raises(NoEligibleGateway):
        await s.run(RetryPolicy(), servers=[])
    assert s.gateways.calls == []
    assert s.recorder.events == [("start",), ("failed", "-", "NoEligibleGateway")]


async def test_pinned_gateway_with_an_open_circuit_fails_fast(s: Setup) -> None:
    stats = StatsRegistry(s.clock, StatsSettings(failure_threshold=1))
    ticket = stats.on_start("gw1")
    assert ticket is not None
    stats.on_failure(ticket)
    s.stats = stats
    with pytest.raises(GatewayUnavailable, match="gw1: circuit open"):
        await s.run(RetryPolicy(3, 0), pinned=SERVERS[1])
    assert s.gateways.calls == []


async def test_retries_stop_when_the_circuit_opens(s: Setup) -> None:
    s.stats = StatsRegistry(s.clock, StatsSettings(failure_threshold=2))
    s.gateways.fail = {"gw3": -1}
    with pytest.raises(Transport):
        await s.run(RetryPolicy(5, 0), pinned=SERVERS[3])
    assert s.gateways.calls == ["gw3", "gw3"]


async def test_an_open_circuit_sends_unpinned_retries_elsewhere(s: Setup) -> None:
    s.stats = StatsRegistry(s.clock, StatsSettings(failure_threshold=1))
    s.gateways.fail = {"gw0": -1}
    result = await s.run(RetryPolicy(5, 1))
    first, second = s.gateways.calls
    assert first == "gw0" and second != "gw0" and result == f"ok from {second}"


async def test_a_circuit_that_opens_during_the_backoff_sends_the_retry_elsewhere(
    s: Setup,
) -> None:
    s.stats = StatsRegistry(s.clock, StatsSettings(failure_threshold=2))
    s.gateways.fail = {"gw0": 1}
    delays: list[float] = []

    async def others_fail_meanwhile(seconds: float) -> None:
        delays.append(seconds)
        ticket = s.stats.on_start("gw0")  # a concurrent call's failure trips the circuit
        assert ticket is not None
        s.stats.on_failure(ticket)

    s.sleeps = others_fail_meanwhile  # type: ignore[assignment]
    result = await s.run(RetryPolicy(3, 1, 0.1, 1.0))
    first, second = s.gateways.calls
    assert first == "gw0" and second != "gw0" and result == f"ok from {second}"
    assert len(delays) == 1


async def test_cancelling_leaves_no_call_in_flight_and_frees_the_probe(s: Setup) -> None:
    s.stats = StatsRegistry(s.clock, StatsSettings(failure_threshold=1, cool_off_s=1.0))
    ticket = s.stats.on_start("gw0")
    assert ticket is not None
    s.stats.on_failure(ticket)
    s.clock.advance(1.0)  # half-open: this call is the probe
    started = asyncio.Event()

    async def hang(server: GatewayState) -> str:
        started.set()
        await asyncio.get_running_loop().create_future()
        raise AssertionError("unreachable")

    s.gateways = hang  # type: ignore[assignment]
    task = asyncio.create_task(s.run(RetryPolicy(), pinned=SERVERS[0]))
    await started.wait()
    assert not s.stats.allow("gw0")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert s.stats.in_flight("gw0") == 0
    assert s.stats.allow("gw0")


# --- listeners --------------------------------------------------------------------------


async def test_listeners_see_every_step(s: Setup) -> None:
    s.gateways.fail = {"gw0": 1}
    await s.run(RetryPolicy(1, 1, 0.1, 1.0))
    assert s.recorder.events == [
        ("start",),
        ("server", "gw0", "1", "1"),
        ("exception", "gw0", "Transport"),
        ("server", "gw0", "2", "2"),
        ("success", "gw0", "ok from gw0"),
    ]


async def test_listeners_see_the_final_failure(s: Setup) -> None:
    s.gateways.fail = {"gw0": -1}
    with pytest.raises(Transport):
        await s.run(RetryPolicy(1, 0), pinned=SERVERS[0])
    assert s.recorder.events[-2:] == [
        ("exception", "gw0", "Transport"),
        ("failed", "gw0", "Transport"),
    ]


async def test_a_raising_listener_does_not_fail_the_call(
    s: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    raising = Raising()
    s.gateways.fail = {"gw0": 1}
    with caplog.at_level(logging.ERROR, logger="router.balancing.listeners"):
        assert await s.run(RetryPolicy(0, 1), extra=(raising,)) != "ok from gw0"
    assert raising.calls == 5  # start, server, exception, server, success
    assert len(s.recorder.events) == 5  # the listener after it still heard everything
    assert len(caplog.records) == 5 and "listener bug" in caplog.text


async def test_a_raising_listener_does_not_mask_the_calls_error(s: Setup) -> None:
    s.gateways.fail = {"gw0": -1}
    s.gateways.error = Refused
    with pytest.raises(Refused):
        await s.run(RetryPolicy(), extra=(Raising(),))
