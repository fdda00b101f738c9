def test_recipients_whose_gateway_said_expired_are_told_apart() -> None:
    from router.p2p.plan import GatewayOutcome, merge, plan_p2p
    from router.receipts.record import p2p_receipt
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
