"""A transient gRPC failure on the gateway a user is connected to: the call is retried on
that same gateway, and the user gets the push exactly once, whether the failure came
before the gateway delivered or after it (the answer was lost on the way back)."""

from __future__ import annotations

import pytest

from router.routes.registry import Registration
from tests.integration.stack import AUTH, amy_behind_faults, nothing_more, recv_json

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("after", [True, False], ids=["answer-lost", "never-arrived"])
async def test_a_retry_on_the_same_gateway_delivers_exactly_once(
    redis_url: str, prefix: str, after: bool
) -> None:
    async with amy_behind_faults(redis_url, prefix, retries=1) as (faults, gw, http, ws):
        # bob has a route to gw1 but no connection there: the gateway answers him missing,
        # and the retry must say so too, not claim him delivered.
        assert gw.registry is not None
        await gw.registry.refresh([Registration("bob", "gw1.gone.1")])
        faults.arm(1, after=after)
        resp = await http.post(
            "/v1/push", json={"to": ["amy", "bob"], "content": "hi"}, headers=AUTH
        )
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["delivered"] == ["amy"] and body["failed"] == [], body
        assert body["offline"] == ["bob"], body
        assert faults.failed == 1  # the failure happened, and the retry answered
        frame = await recv_json(ws)
        assert frame["content"] == "hi"
        assert await nothing_more(ws)  # exactly once
        assert gw.deliver_service.duplicates == (1 if after else 0)
        scrape = (await http.get("/metrics")).text
        assert 'imroute_gateway_call_retries_total{gateway="gw1"} 1.0' in scrape


async def test_without_retries_a_transient_failure_is_reported_not_hidden(
    redis_url: str, prefix: str
) -> None:
    async with amy_behind_faults(redis_url, prefix, retries=0) as (faults, _, http, ws):
        faults.arm(1, after=False)
        body = (
            await http.post("/v1/push", json={"to": ["amy"], "content": 1}, headers=AUTH)
        ).json()
        assert body["failed"] == ["amy"] and body["delivered"] == []
        assert body["errors"][0]["error"].startswith("UNAVAILABLE: injected")
        assert await nothing_more(ws)
        body = (
            await http.post("/v1/push", json={"to": ["amy"], "content": 2}, headers=AUTH)
        ).json()
        assert body["delivered"] == ["amy"]
        # The failed push waited in amy's inbox; the next one showed amy's gateway a
        # hole in her sequence, filled from the log first: both arrive, in order.
        assert (await recv_json(ws))["content"] == 1
        assert (await recv_json(ws))["content"] == 2
