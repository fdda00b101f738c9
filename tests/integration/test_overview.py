"""GET /v1/admin/overview (what /dashboard shows): the fleet by group and gateway, the
fleet's rates and delivery latency as every process samples them into Redis, and the
latest jobs. Real Redis, real gateways, real WebSocket clients that ack."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from tests.conftest import ADMIN_KEY
from tests.integration.stack import AUTH, api, client, gateway, recv_json

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


async def _overview(http: Any) -> dict[str, Any]:
    resp = await http.get("/v1/admin/overview", headers=ADMIN)
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


async def test_the_overview_shows_the_fleet_its_rates_and_the_latest_jobs(
    redis_url: str, prefix: str
) -> None:
    async with (
        gateway(redis_url, prefix, "gw1", "g1", heartbeat_s=0.3) as gw1,
        gateway(redis_url, prefix, "gw2", "g2", heartbeat_s=0.3, gateway_max_connections=10) as gw2,
        api(redis_url, prefix, admin_api_key=ADMIN_KEY) as http,
        client(gw1, "amy") as amy,
        client(gw2, "bob") as bob,
        client(gw2, "cid"),
    ):
        # Only the admin key reads it.
        assert (await http.get("/v1/admin/overview", headers=AUTH)).status_code == 403
        assert (await http.get("/v1/admin/overview")).status_code == 401

        for n in range(10):
            resp = await http.post("/v1/push", json={"to": ["amy"], "content": n}, headers=AUTH)
            assert resp.status_code == 200 and resp.json()["delivered"] == ["amy"]
            frame = await recv_json(amy)
            await amy.send(json.dumps({"type": "ack", "pos": frame["pos"]}))
        resp = await http.post("/v1/push", json={"to": ["zoe"], "content": "x"}, headers=AUTH)
        assert resp.json()["queued"] == ["zoe"]
        job = await http.post(
            "/v1/multicast", json={"to": ["bob", "dan"], "content": 1}, headers=AUTH
        )
        assert job.status_code == 202
        assert (await recv_json(bob))["content"] == 1

        # The samplers write every second, into 2-s intervals; the overview averages the
        # last whole ones.
        deadline = time.monotonic() + 10
        while True:
            view = await _overview(http)
            rates = view["rates"]
            if rates and rates["p2p"] and rates["acked"] and rates["multicast"]:
                break
            assert time.monotonic() < deadline, view["rates"]
            await asyncio.sleep(0.5)
        totals = {k: sum(p[k] for p in view["series"]) * view["bucket_ms"] / 1000
                  for k in ("p2p", "queued", "delivered", "acked", "multicast")}  # fmt: skip
        assert totals["p2p"] == 11 and totals["queued"] == 1, totals
        assert totals["acked"] == 10 and totals["multicast"] == 1, totals
        assert totals["delivered"] >= 11, totals  # amy's ten and bob's multicast
        assert rates["p50"] is not None and 0 <= rates["p50"] <= rates["p99"] < 5000, rates

        gws = {g["gateway_id"]: g for g in view["gateways"]}
        assert set(gws) == {"gw1", "gw2"}
        assert (gws["gw1"]["connections"], gws["gw2"]["connections"]) == (1, 2)
        assert gws["gw2"]["max_connections"] == 10 and gws["gw1"]["circuit"] == "closed"
        assert 0 <= gws["gw1"]["heartbeat_age_s"] < 2
        assert gws["gw1"]["calls_per_s"] > 0 and gws["gw1"]["batches_per_s"] > 0
        groups = {g["group_id"]: g for g in view["groups"]}
        assert groups["g2"]["share"] == pytest.approx(2 / 3, abs=0.01)
        assert groups["g1"]["gateways"] == 1 and groups["g2"]["max_connections"] == 10

        jobs = view["jobs"]
        assert jobs[0]["push_id"] == job.json()["push_id"] and jobs[0]["mode"] == "multicast"
        assert jobs[0]["recipients"] == 2
