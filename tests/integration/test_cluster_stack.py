"""Everything the docs offer Redis Cluster for, on a real cluster with replicas.

Real processes: a gateway (`imroute gateway`) and the push service (`python -m
push_service`) with IMROUTE_REDIS_URL=redis+cluster://... (the session's three
primaries, each with a replica) and the bus on the plain Redis, as the deployment page tells a
cluster deployment to. Real WebSocket clients. Each call below names keys of several
slots or runs a script over several keys: jobs (a MULTI and scripts over a job and the
running set), receipts (a script over a receipt and its HyperLogLogs, PFCOUNT read in a
pipeline), idempotency entries, rate-limit buckets, the webhook outbox and presence, the
dashboard's stats and jobs list.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect

from router.directory.migrate import upgrade
from router.processes.ports import free_port, free_port_block
from shared.keys import slot_tagged
from tests.integration.cluster_stack import cluster_env, processes
from tests.integration.procs import BIN, Proc, directory_url, read_until, running
from tests.integration.recovery_helpers import ack
from tests.integration.redis_cluster import LocalCluster
from tests.integration.stack import AUTH, ready, recv_json, token
from tests.integration.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.integration

HOOK_SECRET = "cluster-hook-secret-0123456789abcdef"


@dataclass
class Stack:
    api: str  # the push service's base URL
    ws: str  # the gateway's WebSocket URL
    hook_port: int  # where the webhooks go (a receiver is started by the test needing it)
    env: dict[str, str]
    procs: tuple[Proc, ...]  # gateway gw1, the push service, gateway gw2 (drained by a test)


@pytest.fixture(scope="module")
def stack(
    redis_url: str, redis_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    prefix = f"imroute-test:cluster-{free_port()}:"
    db_url = directory_url(tmp_path_factory.mktemp("cluster-db"))
    asyncio.run(upgrade(db_url))
    hook_port = free_port()
    env = cluster_env(
        redis_url,
        redis_cluster,
        prefix,
        db_url,
        IMROUTE_RECEIPTS_MAX_RECIPIENTS="1",  # a push to two users keeps counts only
        IMROUTE_WEBHOOK_URL=f"http://127.0.0.1:{hook_port}/hook",
        IMROUTE_WEBHOOK_SECRET=HOOK_SECRET,
        IMROUTE_WEBHOOK_UNACKED_S="1",
        IMROUTE_WEBHOOK_OFFLINE_GRACE_S="0",
        IMROUTE_WEBHOOK_BACKOFF_MAX_S="0.2",
    )
    with processes(env, "gw1", "gw2") as (api, ws, (gw, gw2, ps)):
        yield Stack(api, ws, hook_port, env, (gw, ps, gw2))


@pytest.fixture
async def http(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stack.api, timeout=15) as client:
        yield client


@contextlib.asynccontextmanager
async def user(stack: Stack, uid: str) -> AsyncIterator[ClientConnection]:
    async with connect(f"{stack.ws}?token={token(uid)}") as ws:
        await ready(ws)
        yield ws


async def pushes(ws: ClientConnection, n: int, timeout: float = 10) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    while len(got) < n:
        frame = await recv_json(ws, timeout)
        if frame["type"] == "push":
            got.append(frame)
    return got


async def finished(http: httpx.AsyncClient, push_id: str) -> dict[str, Any]:
    for _ in range(500):
        job: dict[str, Any] = (await http.get(f"/v1/pushes/{push_id}", headers=AUTH)).json()
        if job.get("status") in ("done", "failed"):
            return job
        await asyncio.sleep(0.02)
    raise AssertionError(f"job {push_id} did not finish: {job}")


async def test_a_p2p_push_and_its_receipts(stack: Stack, http: httpx.AsyncClient) -> None:
    async with user(stack, "alice") as alice, user(stack, "carol") as carol:
        # Listable (one recipient): its states in the receipt hash.
        resp = await http.post("/v1/push", json={"to": ["alice"], "content": 1}, headers=AUTH)
        assert resp.status_code == 200, resp.text
        assert resp.json()["delivered"] == ["alice"]
        (frame,) = await pushes(alice, 1)
        await ack(alice, frame)
        listed = resp.json()["push_id"]
        assert slot_tagged(listed)  # its receipt in alice's slot; its ack derived
        # Counts only (two recipients, over IMROUTE_RECEIPTS_MAX_RECIPIENTS): the
        # HyperLogLogs, which the receipt's script writes and a pipelined PFCOUNT reads.
        resp = await http.post(
            "/v1/push", json={"to": ["carol", "away"], "content": 2}, headers=AUTH
        )
        assert resp.status_code == 200, resp.text
        (frame,) = await pushes(carol, 1)
        await ack(carol, frame)
        counted = resp.json()["push_id"]
        for _ in range(200):
            one = (await http.get(f"/v1/pushes/{listed}", headers=AUTH)).json()
            two = (await http.get(f"/v1/pushes/{counted}", headers=AUTH)).json()
            if one.get("acked") == 1 and two.get("acked") == 1:
                break
            await asyncio.sleep(0.02)
    assert (one["mode"], one["recipients"], one["delivered"], one["listable"]) == (
        "p2p",
        1,
        1,
        True,
    ), one
    assert (two["recipients"], two["delivered"], two["acked"], two["queued"]) == (2, 1, 1, 1)
    assert two["listable"] is False
    page = await http.get(f"/v1/pushes/{listed}/recipients?state=acked", headers=AUTH)
    assert page.status_code == 200, page.text
    assert page.json()["uids"] == ["alice"]


async def test_multicast_and_broadcast_jobs_run_to_done(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    uids = [f"m{i}" for i in range(6)]
    resp = await http.put("/v1/users", json={"users": [{"uid": u} for u in uids]}, headers=AUTH)
    assert resp.status_code == 200, resp.text
    async with user(stack, "m0") as m0, user(stack, "m3") as m3:
        resp = await http.post(
            "/v1/multicast", json={"to": uids[:4], "content": "multi"}, headers=AUTH
        )
        assert resp.status_code == 202, resp.text
        multicast = await finished(http, resp.json()["push_id"])
        resp = await http.post("/v1/broadcast", json={"content": "all"}, headers=AUTH)
        assert resp.status_code == 202, resp.text
        broadcast = await finished(http, resp.json()["push_id"])
        got = {ws: [f["content"] for f in await pushes(ws, 2)] for ws in (m0, m3)}
    assert (multicast["status"], multicast["recipients"], multicast["failed_batches"]) == (
        "done",
        4,
        0,
    ), multicast
    assert (broadcast["status"], broadcast["failed_batches"]) == ("done", 0), broadcast
    assert broadcast["recipients"] >= len(uids)
    assert got[m0] == got[m3] == ["multi", "all"]
    # The dashboard's view: the jobs list ({jobs}:recent) and the stats buckets.
    overview = await http.get("/v1/admin/overview", headers=AUTH)
    assert overview.status_code == 200, overview.text
    listed = {j["push_id"] for j in overview.json()["jobs"]}
    assert {multicast["push_id"], broadcast["push_id"]} <= listed


async def test_an_idempotency_key_replays_the_answer(stack: Stack, http: httpx.AsyncClient) -> None:
    headers = {**AUTH, "Idempotency-Key": "cluster-key-1"}
    async with user(stack, "dave") as dave:
        first = await http.post("/v1/push", json={"to": ["dave"], "content": 3}, headers=headers)
        again = await http.post("/v1/push", json={"to": ["dave"], "content": 3}, headers=headers)
        other = await http.post("/v1/push", json={"to": ["dave"], "content": 4}, headers=headers)
        (frame,) = await pushes(dave, 1)
        with pytest.raises(TimeoutError):
            await pushes(dave, 1, timeout=0.5)
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert frame["msg_id"] == first.json()["msg_id"]
    assert other.status_code == 422, other.text  # the same key for another body


async def test_the_rate_limit_holds(
    redis_url: str, redis_cluster: LocalCluster, stack: Stack, directory_db: str
) -> None:
    env = {**stack.env, "IMROUTE_RATE_LIMIT": "1/s", "IMROUTE_RATE_BURST": "2"}
    env["IMROUTE_DB_URL"] = directory_db
    env["IMROUTE_REDIS_PREFIX"] += "rate:"
    port = free_port_block([0])
    with running([str(BIN / "python"), "-m", "push_service", "--port", str(port)], env) as ps:
        await asyncio.to_thread(read_until, ps, "Uvicorn running on", 60)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=15) as http:
            answers = [
                await http.post("/v1/push", json={"to": ["nobody"], "content": 5}, headers=AUTH)
                for _ in range(4)
            ]
    assert [a.status_code for a in answers[:2]] == [200, 200], [a.text for a in answers]
    refused = answers[2]
    assert refused.status_code == 429, refused.text
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"] == "rate_limited"


async def test_webhooks_are_queued_and_sent(stack: Stack, http: httpx.AsyncClient) -> None:
    def of(kind: str, **match: str) -> bool:
        return any(all(e[k] == v for k, v in match.items()) for e in rx.of_type(kind))

    async with WebhookReceiver(HOOK_SECRET, port=stack.hook_port) as rx:
        async with user(stack, "erin"):
            resp = await http.post("/v1/push", json={"to": ["erin"], "content": 6}, headers=AUTH)
            assert resp.status_code == 200, resp.text
            # Not acked: message.unacked (the receipt's due set, claimed and settled).
            push_id = resp.json()["push_id"]
            await rx.wait_for(lambda: of("message.unacked", push_id=push_id), "unacked")
        await rx.wait_for(lambda: of("user.offline", uid="erin"), "user.offline")
        async with user(stack, "erin"):
            await rx.wait_for(lambda: of("user.online", uid="erin"), "user.online")
    assert rx.rejected == []


async def test_a_drain_keeps_a_gateway_in_the_group(stack: Stack, http: httpx.AsyncClient) -> None:
    # The check that the group keeps a gateway is one script over every drain request
    # of the group (the tag {drain}).
    resp = await http.post("/v1/gateways/gw2/drain", headers=AUTH)
    assert resp.status_code == 202, resp.text
    await asyncio.to_thread(stack.procs[2].wait, 30)  # it had no clients: drained at once
    refused = await http.post("/v1/gateways/gw1/drain", headers=AUTH)
    assert refused.status_code == 409, refused.text
    assert "last gateway of group 'g1'" in refused.json()["detail"]


def test_no_call_above_raised_in_the_service(stack: Stack) -> None:
    """No traceback in the push service's or the gateway's output (an untyped 500, a
    background loop's unexpected error)."""
    lines = [line for proc in stack.procs for line in drain(proc)]
    assert not [line for line in lines if "Traceback" in line], "\n".join(lines)


def drain(proc: Proc) -> list[str]:
    lines = []
    assert proc.lines is not None
    while not proc.lines.empty():
        line = proc.lines.get()
        if line is not None:
            lines.append(line)
    return lines
