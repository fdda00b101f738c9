"""POST /v1/push/batch when part of the fleet is gone: the messages to a SIGKILLed
gateway process fail and wait in their recipients' inboxes, the rest are delivered in
the batch's order, and the recipients get what waited when they come back. Real Redis, a
real gateway process, real WebSocket clients."""

from __future__ import annotations

import signal
from typing import Any

import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import ClientConnection, connect

from router.processes.ports import free_port_block
from shared.keys import KeySchema
from shared.positions import counter_of, decode_pos, epoch_of
from tests.integration.procs import BIN, Proc, gateway_env, running, ws_url_of
from tests.integration.stack import AUTH, api, client, gateway, ready, recv_json, token
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("redis")]


async def _connect(proc: Proc, uid: str, redis: aioredis.Redis, keys: KeySchema) -> Any:
    """A client of the gateway process, once its route is in Redis."""
    ws = await connect(f"{await ws_url_of(proc)}?token={token(uid)}")
    await ready(ws)
    await wait_for(lambda: redis.hlen(keys.route(uid)), f"{uid}'s route", 4.0, every=0.02)
    return ws


async def _contents(ws: ClientConnection, n: int) -> list[Any]:
    return [(await recv_json(ws))["content"] for _ in range(n)]


async def test_a_batch_over_a_killed_gateway_queues_its_part_and_delivers_the_rest(
    redis_url: str, prefix: str, redis: aioredis.Redis
) -> None:
    keys = KeySchema(prefix)
    port = free_port_block([0])
    env = gateway_env(redis_url, prefix)
    # A heartbeat of 5 s keeps the killed gateway in the fleet while the batch is sent.
    argv = [str(BIN / "imroute"), "gateway", "--id", "gwk", "--group", "g1",
            "--ws-port", "0", "--grpc-port", str(port), "--heartbeat", "5"]  # fmt: skip
    async with (
        gateway(redis_url, prefix, "gw1", "g1") as gw1,
        api(redis_url, prefix) as http,
        client(gw1, "ann") as ann,
    ):
        with running(argv, env) as proc:
            kim = await _connect(proc, "kim", redis, keys)
            proc.send_signal(signal.SIGKILL)
            proc.wait(5)
            await kim.close()

        messages: list[dict[str, Any]] = [
            {"to": ["ann"], "content": 0},
            {"to": ["kim"], "content": 1},
            {"to": ["ann", "kim"], "content": 2},
            {"to": ["nobody"], "content": 3},
            {"to": ["kim"], "content": 4, "store": False},
            {"to": ["ann"], "content": 5},
        ]
        resp = await http.post("/v1/push/batch", json={"messages": messages}, headers=AUTH)
        assert resp.status_code == 200, resp.text
        results = resp.json()["results"]
        assert [r["status"] for r in results] == [200] * 6, results
        assert [r["delivered"] for r in results] == [["ann"], [], ["ann"], [], [], ["ann"]]
        assert [r["failed"] for r in results] == [[], ["kim"], ["kim"], [], ["kim"], []]
        assert [r["queued"] for r in results] == [[], ["kim"], ["kim"], ["nobody"], [], []]
        assert results[3]["offline"] == ["nobody"]
        for r in (results[1], results[2], results[4]):
            assert [e["gateway_id"] for e in r["errors"]] == ["gwk"], r
            assert r["errors"][0]["error"].startswith("UNAVAILABLE"), r
        # ann got hers in the batch's order, and nothing else.
        assert await _contents(ann, 3) == [0, 2, 5]

        # Each message has its receipt: kim's two stored ones are queued.
        for i, queued in ((1, 1), (2, 1), (3, 1), (5, 0)):
            pid = results[i]["push_id"]
            status = (await http.get(f"/v1/pushes/{pid}", headers=AUTH)).json()
            assert status["queued"] == queued, (i, status)

        # kim comes back on the live gateway: the stored two wait in the inbox, in order;
        # the one sent with store: false is gone, as a single push's would be.
        async with connect(f"ws://127.0.0.1:{gw1.ws_port}/ws?token={token('kim')}") as ws:
            replayed = await ready(ws)
            assert [f["content"] for f in replayed] == [1, 2], replayed
            assert [f["msg_id"] for f in replayed] == [results[1]["msg_id"], results[2]["msg_id"]]


async def test_a_batch_to_one_user_arrives_in_order_once_each(redis_url: str, prefix: str) -> None:
    """1000 messages to the same user in one batch: one log-and-inbox write, one look-up,
    one gateway's deliveries sent in several calls (256 batches each at most); the
    client gets all of them, in the batch's order, once each."""
    async with (
        gateway(redis_url, prefix, "gw1", "g1") as gw1,
        api(redis_url, prefix) as http,
        client(gw1, "ann") as ann,
    ):
        messages = [{"to": ["ann"], "content": n} for n in range(1000)]
        resp = await http.post("/v1/push/batch", json={"messages": messages}, headers=AUTH)
        assert resp.status_code == 200, resp.text
        results = resp.json()["results"]
        assert all(r["delivered"] == ["ann"] for r in results), [
            r for r in results if r["delivered"] != ["ann"]
        ][:3]
        frames = [await recv_json(ann) for _ in range(1000)]
        assert [f["content"] for f in frames] == list(range(1000))
        assert [f["msg_id"] for f in frames] == [r["msg_id"] for r in results]
        # The log numbered them as it wrote them: ann's P2P positions run 1..1000 (in
        # one epoch: `shared.positions`).
        seqs = [decode_pos(f["pos"]).p for f in frames]
        assert [counter_of(s) for s in seqs] == list(range(1, 1001))
        assert {epoch_of(s) for s in seqs} == {epoch_of(seqs[0])}
