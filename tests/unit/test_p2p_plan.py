def test_recipients_whose_gateway_said_expired_are_told_apart() -> None:
    from router.p2p.plan import GatewayOutcome, merge, plan_p2p
    from router.receipts.base import p2p_receipt
    from shared.models import Message, Route

    routes = {
        "a": [Route("a", "c1", "gw1", "g", "127.0.0.1", 1, 0)],
        "b": [Route("b", "c2", "gw2", "g", "127.0.0.1", 2, 0)],
    }
    plan = plan_p2p(["a", "b", "c"], routes, None)
    outcome = merge(
        ["a", "b", "c"],
        plan,
        [GatewayOutcome("gw1", ["a"]), GatewayOutcome("gw2", error="EXPIRED: late")],
    )
    assert outcome.failed == ["b"] and outcome.expired == ["b"] and outcome.offline == ["c"]
    message = Message("m", "p", 0, "admin", b"1", 1)
    # Past its ttl_s: expired for b; before it (the call's deadline): still queued.
    late = p2p_receipt(message, ["a", "b", "c"], outcome, {}, ttl_passed=True)
    assert late.states == {"a": "d", "b": "x", "c": "q"}
    assert p2p_receipt(message, ["a", "b", "c"], outcome, {}).states["b"] == "q"


def test_routes_of_a_gateway_missing_from_the_fleet_are_called_and_told_apart() -> None:
    """A gateway absent from the live fleet is called at its route's address (its state
    is unknown); one live at another address restarted there: its old routes are not."""
    from router.p2p.plan import GatewayOutcome, merge, plan_p2p
    from shared.models import Route

    routes = {
        "a": [Route("a", "c1", "gw1", "g", "10.0.0.1", 1, 0)],
        "b": [Route("b", "c2", "gw2", "g", "10.0.0.2", 2, 0)],
    }
    live = {"gw2": "10.0.0.9:2"}  # gw1 missing; gw2 restarted at another address
    plan = plan_p2p(["a", "b"], routes, live)
    assert list(plan.targets) == ["gw1"] and plan.targets["gw1"].unknown
    assert [r.uid for r in plan.unknown] == ["a"] and [r.uid for r in plan.stale] == ["b"]
    outcome = merge(["a", "b"], plan, [GatewayOutcome("gw1", error="UNAVAILABLE: refused")])
    assert outcome.failed == ["a"] and outcome.offline == ["b"]
    (error,) = outcome.errors
    assert error.error is not None and error.error.startswith("GATEWAY_STATE_UNKNOWN: gw1 ")
    assert error.error.endswith("UNAVAILABLE: refused") and error.suspect
