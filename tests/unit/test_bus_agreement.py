"""A gateway on another kind of bus than the push service is told of once per start
(router.fleet.bus_agreement), and what a bus URL's kind is (router.bus.factory.bus_kind)."""

from __future__ import annotations

import pytest

from router.bus.factory import bus_kind
from router.fleet.bus_agreement import BusAgreement
from shared.models import GatewayInfo


def gw(gid: str, bus: str, started: int = 1) -> GatewayInfo:
    return GatewayInfo(gid, "g1", "ws://x", f"{gid}:1", 0, started, bus=bus)


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("redis://h:6379/0", "redis"),
        ("rediss://:pw@h:6380/0", "redis"),
        ("unix:///run/redis.sock", "redis"),
        ("pubsub://my-project", "pubsub"),
        ("memory://", "memory"),
        ("no-scheme:secret@h", ""),  # never the rest of a URL: it may hold a password
    ],
)
def test_the_kind_is_the_scheme_with_redis_s_three_as_one(url: str, kind: str) -> None:
    assert bus_kind(url) == kind


def test_each_gateway_apart_is_told_once_per_start() -> None:
    agreement = BusAgreement("pubsub")
    fleet = [gw("gw1", "pubsub"), gw("gw2", "redis"), gw("gw3", "")]  # gw3: not said
    assert [g.gateway_id for g in agreement.newly_apart(fleet)] == ["gw2"]
    assert agreement.newly_apart(fleet) == []
    # Restarted (another start): told again; gone and back under the same start: too,
    # as what was told of a gateway no longer live is forgotten.
    assert [g.gateway_id for g in agreement.newly_apart([gw("gw2", "redis", 2)])] == ["gw2"]
    assert agreement.newly_apart([gw("gw1", "pubsub")]) == []
    assert [g.gateway_id for g in agreement.newly_apart([gw("gw2", "redis", 2)])] == ["gw2"]


def test_a_push_service_whose_bus_was_given_checks_nothing() -> None:
    assert BusAgreement("").newly_apart([gw("gw1", "redis"), gw("gw2", "pubsub")]) == []
