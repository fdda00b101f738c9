"""Balancing rules and the availability filter: pure, on a ManualClock."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable

import pytest

from router.balancing import (
    RULE_NAMES,
    Availability,
    ConsistentHashRule,
    GatewayState,
    LeastConnectionsRule,
    RoundRobinRule,
    Rule,
    StatsRegistry,
    StatsSettings,
    ZoneAffinityRule,
    hrw_score,
    rule_for,
)
from router.testing import ManualClock
from shared.errors import ConfigError

CLOCK_MS = ManualClock().now_ms()
UIDS = [f"user-{i}" for i in range(10_000)]


def gw(
    gateway_id: str,
    group_id: str = "g1",
    *,
    connections: int = 0,
    max_connections: int = 1000,
    zone: str | None = None,
    draining: bool = False,
    deadline_ms: int = CLOCK_MS + 60_000,
) -> GatewayState:
    return GatewayState(
        gateway_id=gateway_id,
        group_id=group_id,
        ws_url=f"ws://{gateway_id}/ws",
        grpc_address=f"{gateway_id}:9000",
        connections=connections,
        max_connections=max_connections,
        zone=zone,
        draining=draining,
        heartbeat_deadline_ms=deadline_ms,
    )


def fleet(groups: int, per_group: int = 2) -> list[GatewayState]:
    return [gw(f"gw{g}-{i}", f"g{g}") for g in range(1, groups + 1) for i in range(per_group)]


@pytest.fixture
def stats(clock: ManualClock) -> StatsRegistry:
    return StatsRegistry(clock, StatsSettings(failure_threshold=1, cool_off_s=10.0))


@pytest.fixture
def available(clock: ManualClock, stats: StatsRegistry) -> Availability:
    return Availability(clock, stats)


def open_circuit(stats: StatsRegistry, gateway_id: str) -> None:
    ticket = stats.on_start(gateway_id)
    assert ticket is not None
    stats.on_failure(ticket)  # threshold 1


RULES: dict[str, Callable[[Availability], Rule]] = {
    "round_robin": RoundRobinRule,
    "least_connections": LeastConnectionsRule,
    "consistent_hash": ConsistentHashRule,
    "zone_affinity": lambda a: ZoneAffinityRule("z1", ConsistentHashRule(a), a),
}


# --- round robin -----------------------------------------------------------------------


def test_round_robin_spreads_1200_choices_within_one(available: Availability) -> None:
    rule = RoundRobinRule(available)
    servers = [gw(f"gw{i}") for i in range(4)]
    counts = Counter(rule.choose(servers, None) for _ in range(1200))
    assert None not in counts
    assert len(counts) == 4
    assert max(counts.values()) - min(counts.values()) <= 1
    assert sum(counts.values()) == 1200


def test_round_robin_skips_a_gateway_that_becomes_ineligible(
    available: Availability, stats: StatsRegistry
) -> None:
    rule = RoundRobinRule(available)
    servers = [gw(f"gw{i}") for i in range(4)]
    first = Counter(rule.choose(servers, None) for _ in range(400))
    assert set(first.values()) == {100}
    open_circuit(stats, "gw2")
    later = Counter(rule.choose(servers, None) for _ in range(300))
    assert servers[2] not in later
    assert max(later.values()) - min(later.values()) <= 1 and len(later) == 3


# --- least connections ---------------------------------------------------------------------


def test_least_connections_takes_the_fewest(available: Availability) -> None:
    servers = [gw("a", connections=5), gw("b", connections=2), gw("c", connections=9)]
    assert LeastConnectionsRule(available).choose(servers, None) == servers[1]


def test_least_connections_breaks_ties_by_calls_in_flight_then_id(
    available: Availability, stats: StatsRegistry
) -> None:
    rule = LeastConnectionsRule(available)
    servers = [gw("c", connections=1), gw("b", connections=1), gw("a", connections=1)]
    assert rule.choose(servers, None) == servers[2]  # all equal: the smallest id
    stats.on_start("a")
    assert rule.choose(servers, None) == servers[1]  # "a" has a call in flight


# --- consistent hash ------------------------------------------------------------------


def test_hrw_score_is_stable_across_processes() -> None:
    # Pinned values: a salted hash() or a changed encoding would move every user.
    assert hrw_score("g1", "alice") == 6175825651323869483
    assert hrw_score("g2", "alice") == 3134424466470300804


def test_consistent_hash_keeps_a_user_in_one_group(available: Availability) -> None:
    servers = fleet(4)
    first = {uid: ConsistentHashRule(available).choose(servers, uid) for uid in UIDS[:500]}
    rule = ConsistentHashRule(available)
    busier = [dataclasses.replace(s, connections=(i * 37) % 500) for i, s in enumerate(servers)]
    for uid, chosen in first.items():
        assert chosen is not None
        for fleet_now in (servers, busier, list(reversed(servers))):
            again = rule.choose(fleet_now, uid)
            assert again is not None and again.group_id == chosen.group_id


def test_consistent_hash_balances_groups(available: Availability) -> None:
    rule = ConsistentHashRule(available)
    servers = fleet(4)
    per_group = Counter(_group(rule, servers, uid) for uid in UIDS)
    assert all(2200 <= n <= 2800 for n in per_group.values()), per_group


def _group(rule: Rule, servers: list[GatewayState], uid: str) -> str:
    chosen = rule.choose(servers, uid)
    assert chosen is not None
    return chosen.group_id


def test_adding_a_fifth_group_moves_about_a_fifth_of_users(available: Availability) -> None:
    rule = ConsistentHashRule(available)
    four, five = fleet(4), fleet(5)
    before = {uid: _group(rule, four, uid) for uid in UIDS}
    after = {uid: _group(rule, five, uid) for uid in UIDS}
    moved = [uid for uid in UIDS if before[uid] != after[uid]]
    assert 0.15 <= len(moved) / len(UIDS) <= 0.25
    assert all(after[uid] == "g5" for uid in moved)  # only to the new group


def test_losing_a_group_moves_only_its_users(available: Availability) -> None:
    rule = ConsistentHashRule(available)
    servers = fleet(4)
    before = {uid: _group(rule, servers, uid) for uid in UIDS}
    # g3 drains entirely (as if it had left): its gateways are no longer eligible.
    without = [dataclasses.replace(s, draining=s.group_id == "g3") for s in servers]
    after = {uid: _group(rule, without, uid) for uid in UIDS}
    moved = {uid for uid in UIDS if before[uid] != after[uid]}
    assert moved == {uid for uid in UIDS if before[uid] == "g3"}
    assert moved and "g3" not in after.values()


def test_consistent_hash_takes_the_least_loaded_gateway_of_the_group(
    available: Availability,
) -> None:
    rule = ConsistentHashRule(available)
    servers = [
        gw("a1", "ga", connections=90, max_connections=100),
        gw("a2", "ga", connections=150, max_connections=1000),  # less loaded relatively
        gw("a3", "ga", connections=10, max_connections=10),  # full
    ]
    assert rule.choose(servers, "anyone") == servers[1]


def test_consistent_hash_without_a_key_takes_the_least_loaded(available: Availability) -> None:
    servers = [gw("a", "g1", connections=50), gw("b", "g2", connections=20)]
    assert ConsistentHashRule(available).choose(servers, None) == servers[1]


# --- availability, for every rule ----------------------------------------------------


@pytest.mark.parametrize("name", sorted(RULES))
def test_ineligible_gateways_are_never_chosen(
    name: str, available: Availability, stats: StatsRegistry
) -> None:
    good = [gw("good1", "g1", zone="z2"), gw("good2", "g2", zone="z2")]
    bad = [
        gw("stale", "g3", zone="z1", deadline_ms=CLOCK_MS - 1),
        gw("stale-now", "g3", zone="z1", deadline_ms=CLOCK_MS),  # deadline must be > now
        gw("draining", "g4", zone="z1", draining=True),
        gw("full", "g5", zone="z1", connections=1000, max_connections=1000),
        gw("tripped", "g6", zone="z1"),
    ]
    open_circuit(stats, "tripped")
    rule = RULES[name](available)
    chosen = {rule.choose(bad + good, uid) for uid in UIDS[:2000]}
    assert chosen <= set(good) and chosen


@pytest.mark.parametrize("name", sorted(RULES))
def test_none_when_nothing_is_eligible(
    name: str, available: Availability, stats: StatsRegistry
) -> None:
    servers = [
        gw("stale", deadline_ms=CLOCK_MS - 1),
        gw("draining", draining=True),
        gw("full", connections=5, max_connections=5),
        gw("tripped"),
    ]
    open_circuit(stats, "tripped")
    rule = RULES[name](available)
    assert rule.choose(servers, "alice") is None
    assert rule.choose(servers, None) is None
    assert rule.choose([], "alice") is None


def test_a_heartbeat_lapses_with_time(clock: ManualClock, available: Availability) -> None:
    server = gw("a", deadline_ms=CLOCK_MS + 1500)
    rule = RoundRobinRule(available)
    assert rule.choose([server], None) == server
    clock.advance(1.5)
    assert rule.choose([server], None) is None


def test_half_open_is_eligible_only_while_the_probe_slot_is_free(
    clock: ManualClock, available: Availability, stats: StatsRegistry
) -> None:
    server = gw("a")
    rule = RoundRobinRule(available)
    open_circuit(stats, "a")
    assert rule.choose([server], None) is None
    clock.advance(10.0)
    assert rule.choose([server], None) == server
    assert stats.on_start("a") is not None  # the probe goes out
    assert rule.choose([server], None) is None


def test_capacity_can_be_ignored_for_calls(clock: ManualClock) -> None:
    full = gw("a", connections=10, max_connections=10)
    assert RoundRobinRule(Availability(clock)).choose([full], None) is None
    lenient = Availability(clock, require_capacity=False)
    assert RoundRobinRule(lenient).choose([full], None) == full


# --- zone affinity ------------------------------------------------------------------------


def test_zone_affinity_prefers_the_zone(available: Availability) -> None:
    rule = ZoneAffinityRule("z1", RoundRobinRule(available), available)
    servers = [gw("far1", zone="z2"), gw("near", zone="z1"), gw("far2", zone=None)]
    assert {rule.choose(servers, None) for _ in range(20)} == {servers[1]}


def test_zone_affinity_falls_back_when_the_zone_is_full(available: Availability) -> None:
    rule = ZoneAffinityRule("z1", RoundRobinRule(available), available)
    servers = [
        gw("near", zone="z1", connections=3, max_connections=3),
        gw("far1", zone="z2"),
        gw("far2", zone="z3"),
    ]
    assert {rule.choose(servers, None) for _ in range(20)} == set(servers[1:])


def test_zone_affinity_without_a_zone_is_the_wrapped_rule(available: Availability) -> None:
    rule = ZoneAffinityRule(None, LeastConnectionsRule(available), available)
    servers = [gw("a", zone="z1", connections=5), gw("b", zone="z2", connections=1)]
    assert rule.choose(servers, None) == servers[1]


def test_zone_affinity_keeps_users_sticky_inside_the_zone(available: Availability) -> None:
    rule = rule_for("zone_affinity", available, zone="z1")
    servers = [gw(f"gw{g}", f"g{g}", zone="z1" if g < 3 else "z2") for g in range(6)]
    for uid in UIDS[:200]:
        chosen = rule.choose(servers, uid)
        assert chosen is not None and chosen.zone == "z1"
        assert rule.choose(list(reversed(servers)), uid) == chosen


# --- the factory ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("consistent_hash", ConsistentHashRule),
        ("round_robin", RoundRobinRule),
        ("least_connections", LeastConnectionsRule),
        ("zone_affinity", ZoneAffinityRule),
        (" Round_Robin ", RoundRobinRule),
    ],
)
def test_rule_for_builds_each_rule(name: str, kind: type, available: Availability) -> None:
    assert isinstance(rule_for(name, available), kind)


@pytest.mark.parametrize("name", ["", "random", "roundrobin", "weighted"])
def test_rule_for_rejects_other_names(name: str, available: Availability) -> None:
    with pytest.raises(ConfigError) as caught:
        rule_for(name, available)
    message = str(caught.value)
    assert "IMROUTE_DISPATCH_RULE" in message and repr(name) in message
    assert all(accepted in message for accepted in RULE_NAMES)
