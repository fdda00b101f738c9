"""Dispatch that learns from clients: `?avoid=` and the gateways clients show failing
(router.balancing.connects, router.fleet.dispatch), pure, on a ManualClock."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest

from router.balancing import (
    Availability,
    ConnectReports,
    ConnectSettings,
    ConsistentHashRule,
    LeastConnectionsRule,
    failing,
)
from router.balancing.connects import CONNECT_FAILURES, CONNECTS, MAX_REMEMBERED
from router.fleet.cache import CachedFleet
from router.fleet.dispatch import ConnectHealth, Dispatcher, choose_avoiding, to_state
from router.testing import ManualClock
from shared.errors import ConfigError, RegistryUnavailable
from shared.models import GatewayInfo

SETTINGS = ConnectSettings(window_s=30.0, min_failures=5, ratio=1.0)


def info(gateway_id: str, group_id: str = "g1", connections: int = 0) -> GatewayInfo:
    clock = ManualClock()
    return GatewayInfo(
        gateway_id,
        group_id,
        f"ws://{gateway_id}/ws",
        f"{gateway_id}:9000",
        connections,
        clock.now_ms() - 60_000,
        max_connections=1000,
        deadline_ms=clock.now_ms() + 3_600_000,
    )


# --- the decision ------------------------------------------------------------------------


def test_a_gateway_fails_with_enough_failed_connects_beyond_the_ratio() -> None:
    ids = ["gw1", "gw2", "gw3", "gw4"]
    counts = {
        CONNECT_FAILURES + "gw1": 5,  # 5 failed, none succeeded: failing
        CONNECT_FAILURES + "gw2": 4,  # below min_failures
        CONNECT_FAILURES + "gw3": 50,
        CONNECTS + "gw3": 50,  # as many succeeded: not more than ratio 1.0 times
        CONNECTS + "gw4": 1000,
    }
    assert failing(counts, ids, SETTINGS) == {"gw1"}
    counts[CONNECT_FAILURES + "gw3"] = 51
    assert failing(counts, ids, SETTINGS) == {"gw1", "gw3"}
    assert failing(counts, ids, ConnectSettings(min_failures=0)) == frozenset()
    assert failing(counts, ids, ConnectSettings(min_failures=5, ratio=0.0)) == {"gw1", "gw3"}
    assert failing(counts, ["gw2", "gw4"], SETTINGS) == frozenset()


@pytest.mark.parametrize(
    "kw",
    [{"window_s": 0}, {"window_s": float("nan")}, {"min_failures": -1}, {"ratio": -0.5}],
)
def test_bad_settings_are_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        ConnectSettings(**kw)  # type: ignore[arg-type]


def test_a_user_counts_once_per_gateway_per_window() -> None:
    clock = ManualClock()
    reports = ConnectReports(clock, window_s=30)
    assert reports.report("alice", ["gw1"]) == ["gw1"]
    assert reports.report("alice", ["gw1", "gw2"]) == ["gw2"]
    assert [reports.report("alice", ["gw1"]) for _ in range(100)] == [[]] * 100
    assert reports.report("bob", ["gw1"]) == ["gw1"]
    assert reports.counts() == {CONNECT_FAILURES + "gw1": 2, CONNECT_FAILURES + "gw2": 1}
    clock.advance(30)  # the next window: alice counts again
    assert reports.report("alice", ["gw1"]) == ["gw1"]
    assert reports.failed["gw1"] == 3
    reports.retain(["gw2"])  # gw1 left the fleet
    assert reports.counts() == {CONNECT_FAILURES + "gw2": 1}


def test_past_the_users_remembered_every_report_counts() -> None:
    clock = ManualClock()
    reports = ConnectReports(clock, window_s=30)
    for i in range(MAX_REMEMBERED):
        reports.report(f"u{i}", ["gw1"])
    assert reports.report("late", ["gw1"]) == ["gw1"]
    assert reports.report("late", ["gw1"]) == ["gw1"]  # not remembered: counted again
    assert reports.report("u0", ["gw1"]) == []


# --- choosing around avoided and failing gateways -----------------------------------------

GROUPS = [("gw1", "g1"), ("gw2", "g1"), ("gw3", "g2"), ("gw4", "g2")]


def states(connections: dict[str, int] | None = None) -> list:  # type: ignore[type-arg]
    c = connections or {}
    return [to_state(info(g, group, c.get(g, 0))) for g, group in GROUPS]


def test_an_avoided_gateway_is_never_chosen_while_its_group_has_another() -> None:
    rule = ConsistentHashRule(Availability(ManualClock()))
    # gw1 is the emptiest: without avoid, users of g1 all land there.
    servers = states({"gw1": 0, "gw2": 50, "gw3": 10, "gw4": 10})
    users = [f"user-{i}" for i in range(400)]
    plain = {u: rule.choose(servers, u) for u in users}
    in_g1 = [u for u in users if plain[u].group_id == "g1"]  # type: ignore[union-attr]
    assert in_g1 and {plain[u].gateway_id for u in in_g1} == {"gw1"}  # type: ignore[union-attr]
    for u in users:
        chosen = choose_avoiding(rule, servers, u, frozenset({"gw1"}), frozenset())
        assert chosen is not None
        assert chosen.group_id == plain[u].group_id  # type: ignore[union-attr]
        assert chosen.gateway_id != "gw1"
    # gw1 failing for everyone: the same, without any client's avoid.
    for u in in_g1:
        chosen = choose_avoiding(rule, servers, u, frozenset(), frozenset({"gw1"}))
        assert chosen is not None and chosen.gateway_id == "gw2"


def test_a_group_with_nothing_else_hands_its_users_to_another_group() -> None:
    rule = ConsistentHashRule(Availability(ManualClock()))
    servers = states()
    for u in (f"user-{i}" for i in range(200)):
        chosen = choose_avoiding(rule, servers, u, frozenset({"gw1", "gw2"}), frozenset())
        assert chosen is not None and chosen.group_id == "g2"


def test_the_avoided_gateway_is_returned_when_it_is_the_only_choice() -> None:
    rule = LeastConnectionsRule(Availability(ManualClock()))
    only = [to_state(info("gw1"))]
    assert choose_avoiding(rule, only, "u", frozenset({"gw1"}), frozenset({"gw1"})) == only[0]
    # Failing and avoided gateways only: the failing one the client did not name wins.
    two = [to_state(info("gw1")), to_state(info("gw2", connections=5))]
    chosen = choose_avoiding(rule, two, "u", frozenset({"gw1"}), frozenset({"gw2"}))
    assert chosen is not None and chosen.gateway_id == "gw2"
    assert choose_avoiding(rule, [], "u", frozenset({"gw1"}), frozenset()) is None


# --- the dispatcher, learning through the fleet's counts ----------------------------------


class Fleet:
    def __init__(self, infos: list[GatewayInfo]) -> None:
        self.infos = infos

    async def announce(self, info: GatewayInfo) -> bool:
        return True

    async def withdraw(self, gateway_id: str) -> None:
        pass

    async def live(self) -> list[GatewayInfo]:
        return list(self.infos)


class Counts:
    """The fleet's counts: what `reports` counted, and the gateways' connects, per
    second, as the stats sampler would add them; `down` fails every read."""

    def __init__(self, clock: ManualClock, reports: ConnectReports) -> None:
        self.clock = clock
        self.reports = reports
        self.at: list[tuple[int, dict[str, int]]] = []
        self.last: dict[str, int] = {}
        self.down = False

    def sample(self, connects: dict[str, int] | None = None) -> None:
        now = dict(self.reports.counts())
        moved = {k: v - self.last.get(k, 0) for k, v in now.items()}
        self.last = now
        moved.update({CONNECTS + g: n for g, n in (connects or {}).items()})
        self.at.append((self.clock.now_ms(), moved))

    async def sums(self, since_ms: int, until_ms: int, names: Sequence[str]) -> dict[str, int]:
        if self.down:
            raise RegistryUnavailable("redis down")
        out: Counter[str] = Counter()
        for at, counts in self.at:
            if since_ms <= at <= until_ms:
                out.update({k: v for k, v in counts.items() if k in names})
        return dict(out)


async def test_dispatch_stops_choosing_a_gateway_clients_report_and_takes_it_back() -> None:
    clock = ManualClock()
    fleet = Fleet([info("gw1", connections=0), info("gw2", connections=40)])
    cached = CachedFleet(fleet, clock, max_age_s=1.0)
    reports = ConnectReports(clock, SETTINGS.window_s)
    counts = Counts(clock, reports)
    health = ConnectHealth(counts, clock, SETTINGS, reports)
    dispatcher = Dispatcher(cached, clock, "consistent_hash", connects=health)

    async def fresh(n: int) -> Counter[str]:
        return Counter([(await dispatcher.choose(f"fresh-{i}")).gateway_id for i in range(n)])

    # gw1 (cut off from its clients) is the emptiest: fresh clients go there.
    assert (await fresh(10))["gw1"] == 10
    # Each client that failed there asks with avoid=gw1 and is sent to gw2 at once.
    for i in range(4):
        assert (await dispatcher.choose(f"cut-{i}", avoid={"gw1"})).gateway_id == "gw2"
    assert (await dispatcher.choose("cut-0", avoid={"gw1", "nope"})).gateway_id == "gw2"
    counts.sample()
    clock.advance(1.1)  # the fleet read again: 4 users reported, below min_failures
    assert (await fresh(5))["gw1"] == 5
    assert dispatcher.failing() == frozenset()
    await dispatcher.choose("cut-4", avoid={"gw1"})
    counts.sample()
    clock.advance(1.1)
    assert (await fresh(20)) == {"gw2": 20}
    assert dispatcher.failing() == {"gw1"}
    # Redis unreachable for the counts: the last view stands.
    counts.down = True
    clock.advance(1.1)
    assert (await fresh(5)) == {"gw2": 5}
    counts.down = False
    # Reports stop: once they are older than the window, gw1 is chosen again.
    clock.advance(SETTINGS.window_s)
    assert (await fresh(5))["gw1"] == 5
    assert dispatcher.failing() == frozenset()


async def test_successful_connects_outweigh_a_few_clients_reports() -> None:
    clock = ManualClock()
    fleet = Fleet([info("gw1"), info("gw2", connections=40)])
    reports = ConnectReports(clock, SETTINGS.window_s)
    counts = Counts(clock, reports)
    dispatcher = Dispatcher(
        CachedFleet(fleet, clock, 1.0),
        clock,
        "least_connections",
        connects=ConnectHealth(counts, clock, SETTINGS, reports),
    )
    for i in range(8):  # 8 clients on networks that cannot reach gw1
        assert (await dispatcher.choose(f"u{i}", avoid=["gw1"])).gateway_id == "gw2"
    counts.sample({"gw1": 100})  # while 100 others connected to it
    clock.advance(1.1)
    assert (await dispatcher.choose("fresh")).gateway_id == "gw1"
    assert dispatcher.failing() == frozenset()
    # The connects stop succeeding (gw1 cut off), the reports go on.
    clock.advance(SETTINGS.window_s)
    for i in range(8):
        await dispatcher.choose(f"u{i}", avoid=["gw1"])
    counts.sample()
    clock.advance(1.1)
    assert (await dispatcher.choose("fresh")).gateway_id == "gw2"
