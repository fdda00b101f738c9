"""A bus that cannot take a publish, where every batch is logged apart first (Pub/Sub):
the gateways write each batch from its topic's recovery log, the job ends `done` with
none failed, and after the first failed publish the job leaves the bus alone (the log
carries the rest), so a bus that stays down costs no publish timeout per batch. Real
Redis, real gateways and WebSocket clients; the push service's bus fails every attempt."""

from __future__ import annotations

from typing import Any

import pytest

from router.bus import HedgedBus
from router.hedging import RetrySettings
from router.testing import MemoryBus, UnreachableTransport
from tests.integration.stack import AUTH, client, nothing_more, recv_json, two_groups
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]


async def test_batches_a_bus_would_not_take_reach_the_clients_from_the_log(
    redis_url: str, prefix: str
) -> None:
    retry = RetrySettings(initial_backoff_s=0.01, max_backoff_s=0.01, total_timeout_s=0.3)
    down = UnreachableTransport()
    async with MemoryBus() as bus, HedgedBus(down, retry=retry) as broken:
        async with (
            two_groups(redis_url, prefix, bus, broken) as (gw1, gw2, http),
            client(gw1, "ann") as ann,
            client(gw2, "bob") as bob,
        ):
            body = {"to": ["ann", "bob"], "content": "through the log"}
            resp = await http.post("/v1/multicast", json=body, headers=AUTH)
            assert resp.status_code == 202, resp.text
            push_id = resp.json()["push_id"]
            for ws in (ann, bob):  # within the gateways' head poll (1 s) and hold
                frame = await recv_json(ws, timeout=5)
                assert (frame["content"], frame["push_id"]) == ("through the log", push_id)
                assert await nothing_more(ws, 0.3)

            async def job() -> dict[str, Any]:
                answer: dict[str, Any] = (
                    await http.get(f"/v1/pushes/{push_id}", headers=AUTH)
                ).json()
                return answer

            async def done() -> bool:
                return bool((await job())["status"] == "done")

            await wait_for(done, "the job's end", 10)
            status = await job()
            assert (status["status"], status["batches"], status["published"]) == ("done", 2, 2)
            assert (status["failed_batches"], status["failed"]) == (0, []), status
            # Two group batches: the first publish was tried (and retried) until its
            # total timeout, the second went to the log alone.
            first = down.attempts
            assert first >= 2
            resp = await http.post("/v1/multicast", json={**body, "content": "again"}, headers=AUTH)
            for ws in (ann, bob):
                assert (await recv_json(ws, timeout=5))["content"] == "again"
            assert down.attempts == first  # within BUS_RETRY_S: the bus left alone
            assert (gw1.deliver_service.batches, gw2.deliver_service.batches) >= (2, 2)
