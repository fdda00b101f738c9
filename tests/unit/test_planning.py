from __future__ import annotations

from router.p2p.plan import GatewayOutcome, merge, plan_p2p
from shared.models import Route

LIVE = {"gw1": "127.0.0.1:9001", "gw2": "127.0.0.1:9002"}


def route(uid: str, gw: str, conn: str = "") -> Route:
    return Route(uid, conn or f"{gw}.{uid}", gw, "g", "127.0.0.1", 9000 + int(gw[-1]), 10**13)


def test_recipients_are_grouped_one_target_per_gateway() -> None:
    routes = {
        "a": [route("a", "gw1")],
        "b": [route("b", "gw2")],
        "c": [route("c", "gw1"), route("c", "gw1", "second-device"), route("c", "gw2")],
    }
    plan = plan_p2p(["a", "b", "c", "d"], routes, LIVE)
    assert set(plan.targets) == {"gw1", "gw2"}
    assert plan.targets["gw1"].uids == ["a", "c"]  # c once, despite two devices there
    assert plan.targets["gw2"].uids == ["b", "c"]
    assert plan.targets["gw1"].address == "127.0.0.1:9001"
    assert plan.offline == ["d"]
    assert plan.stale == []


def test_routes_of_gateways_missing_from_the_fleet_are_tried_as_unknown() -> None:
    """A route whose gateway is missing from the live fleet is live (its gateway wrote
    it within the route TTL), so the gateway is called at its address and its state
    reported unknown if that fails; a route of a gateway live at another address (its
    previous life's) is still never called."""
    moved = Route("c", "gw2.c", "gw2", "g", "127.0.0.1", 9999, 10**13)
    routes = {"a": [route("a", "gw1")], "b": [route("b", "gw9"), route("b", "gw2")], "c": [moved]}
    plan = plan_p2p(["a", "b", "c"], routes, {"gw2": LIVE["gw2"]})
    assert plan.offline == ["c"]
    assert list(plan.targets) == ["gw1", "gw9", "gw2"]
    assert plan.targets["gw1"].unknown and not plan.targets["gw2"].unknown
    assert {r.gateway_id for r in plan.unknown} == {"gw1", "gw9"}
    assert plan.stale == [moved]


def test_unknown_fleet_trusts_every_route() -> None:
    plan = plan_p2p(["a"], {"a": [route("a", "gw1")]}, None)
    assert list(plan.targets) == ["gw1"]


def test_merge_reports_failed_gateways_and_missing_routes() -> None:
    routes = {
        "a": [route("a", "gw1")],
        "b": [route("b", "gw2")],
        "c": [route("c", "gw1"), route("c", "gw2")],
        "d": [route("d", "gw1")],
    }
    plan = plan_p2p(["a", "b", "c", "d", "e"], routes, LIVE)
    outcomes = [
        GatewayOutcome("gw1", delivered=["a"], missing=["c", "d"]),
        GatewayOutcome("gw2", error="UNAVAILABLE: connection refused"),
    ]
    out = merge(["a", "b", "c", "d", "e"], plan, outcomes)
    assert out.delivered == ["a"]
    assert out.failed == ["b", "c"]  # had routes, but the gateway holding them failed
    assert out.offline == ["d", "e"]
    assert [e.gateway_id for e in out.errors] == ["gw2"]
    assert {(r.uid, r.gateway_id) for r in out.gone} == {("c", "gw1"), ("d", "gw1")}


def test_delivered_anywhere_wins_over_a_failure_elsewhere() -> None:
    routes = {"a": [route("a", "gw1"), route("a", "gw2")]}
    plan = plan_p2p(["a"], routes, LIVE)
    out = merge(
        ["a"], plan, [GatewayOutcome("gw1", delivered=["a"]), GatewayOutcome("gw2", error="x")]
    )
    assert out.delivered == ["a"] and out.failed == []


def test_routes_from_a_gateways_previous_address_are_not_trusted() -> None:
    old = Route("a", "old-conn", "gw1", "g", "10.0.0.5", 9001, 10**13)  # before a restart
    new = route("a", "gw1", "new-conn")
    plan = plan_p2p(["a"], {"a": [old, new]}, LIVE)
    assert plan.targets["gw1"].address == "127.0.0.1:9001"
    assert [r.conn_id for r in plan.targets["gw1"].routes] == ["new-conn"]
    assert plan.stale == [old]
    only_old = plan_p2p(["a"], {"a": [old]}, LIVE)
    assert only_old.offline == ["a"] and only_old.targets == {}
