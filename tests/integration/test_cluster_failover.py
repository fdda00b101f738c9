"""A Redis Cluster master failover under load: JSON 503s while it lasts, nothing lost.

Real processes on a cluster of its own (three primaries, each with a replica, a
cluster-node-timeout of 2 s): a gateway and the push service (bus on the plain Redis).
Thirty WebSocket clients listen while sixteen callers push, each push to three users
(keys of several slots, so pipelines span nodes), a prober starts a push every quarter
second, and another caller sends multicasts and reads receipts. The primary holding the
jobs' slot is then SIGKILLed, or SIGSTOPped until its replica took over. Every answer
must be a 200 (202) or the documented JSON 503 with Retry-After, never a 500 or a
dropped connection; every recipient a 200 answered `delivered` got the push live, and
every one answered `queued` finds it in its inbox on reconnecting; every accepted
multicast ends; and a push begun after the cluster says ok is answered 200 within
RECOVERY_S of it. Run with -s to see the counts and times.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from shared.keys import KeySchema
from tests.integration.cluster_stack import cluster_env, processes
from tests.integration.procs import Proc
from tests.integration.redis_cluster import LocalCluster, cluster_nodes
from tests.integration.stack import AUTH, ready, token

pytestmark = pytest.mark.integration

USERS = 30
CALLERS = 16
PER_PUSH = 3
WARM_S = 2.0
AFTER_S = 4.0  # load kept on after the recovery
# The bound: a push that starts after the cluster says ok is answered 200 within this
# long of it. Its first command may still go to the stopped primary (the client reads
# the new topology only once a command fails) and give up after IMROUTE_REDIS_TIMEOUT_S.
# (A push begun before the failover may take a few timeouts: docs/operations/failure-modes.md,
# "When Redis fails".)
REDIS_TIMEOUT_S = 5.0
RECOVERY_S = 2 * REDIS_TIMEOUT_S + 3
PROBE_EVERY_S = 0.25
PREFIX = "imroute-test:failover:"


@dataclass
class Answer:
    started: float
    ended: float
    to: list[str]
    status: int | str  # a transport error's repr
    body: Any = None
    retry_after: str | None = None
    probe: bool = False


@dataclass
class Run:
    answers: list[Answer] = field(default_factory=list)
    others: list[Answer] = field(default_factory=list)  # multicasts and receipt reads
    got: dict[str, set[str]] = field(default_factory=dict)  # uid -> msg_ids received live


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    with cluster_nodes(3, replicas=1, node_timeout_ms=2000) as fresh:
        yield fresh


@contextlib.contextmanager
def services(redis_url: str, cluster: LocalCluster, db_url: str) -> Iterator[tuple[str, str, Proc]]:
    """(the API's base URL, the gateway's WebSocket URL, the push service process)."""
    env = cluster_env(redis_url, cluster, PREFIX, db_url)
    with processes(env, "gw1") as (api, ws_url, (_, ps)):
        yield api, ws_url, ps


@contextlib.asynccontextmanager
async def listening(ws_url: str, run: Run) -> AsyncIterator[None]:
    async def listen(uid: str, ws: ClientConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for data in ws:
                frame = json.loads(data)
                if frame["type"] == "push":
                    run.got[uid].add(frame["msg_id"])

    async with contextlib.AsyncExitStack() as stack:
        tasks = []
        for i in range(USERS):
            uid = f"u{i}"
            ws = await stack.enter_async_context(connect(f"{ws_url}?token={token(uid)}"))
            await ready(ws)
            run.got[uid] = set()
            tasks.append(asyncio.create_task(listen(uid, ws)))
        try:
            yield
        finally:
            await asyncio.sleep(1.0)  # the last pushes' frames
            for task in tasks:
                task.cancel()


async def push(http: httpx.AsyncClient, to: list[str], n: int, probe: bool = False) -> Answer:
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        resp = await http.post("/v1/push", json={"to": to, "content": n}, headers=AUTH)
    except httpx.HTTPError as exc:
        return Answer(started, loop.time(), to, repr(exc), probe=probe)
    try:
        body = resp.json()
    except ValueError:
        body = resp.text
    retry_after = resp.headers.get("retry-after")
    return Answer(started, loop.time(), to, resp.status_code, body, retry_after, probe)


async def caller(api: str, k: int, run: Run, stop: asyncio.Event) -> None:
    """Pushes one after another, each to PER_PUSH users."""
    async with httpx.AsyncClient(base_url=api, timeout=30) as http:
        n = 0
        while not stop.is_set():
            to = [f"u{(k * 7 + n * PER_PUSH + j) % USERS}" for j in range(PER_PUSH)]
            n += 1
            answer = await push(http, to, n)
            run.answers.append(answer)
            if answer.status != 200:
                await asyncio.sleep(0.05)


async def prober(api: str, run: Run, stop: asyncio.Event) -> None:
    """A push every PROBE_EVERY_S, not waiting for the one before: how soon one that
    starts after the failover is answered (the callers may all be waiting meanwhile)."""

    async def probe(n: int) -> None:
        run.answers.append(await push(http, [f"u{n % USERS}"], -n, probe=True))

    async with httpx.AsyncClient(base_url=api, timeout=30, limits=httpx.Limits()) as http:
        probes = []
        n = 0
        while not stop.is_set():
            n += 1
            probes.append(asyncio.create_task(probe(n)))
            await asyncio.sleep(PROBE_EVERY_S)
        await asyncio.gather(*probes)


async def group_caller(api: str, run: Run, stop: asyncio.Event) -> None:
    """A multicast, then the receipt of the latest P2P push, over and over."""
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(base_url=api, timeout=30) as http:
        n = 0
        while not stop.is_set():
            n += 1
            to = [f"u{(n * 5 + j) % USERS}" for j in range(5)]
            latest = next((a for a in reversed(run.answers) if a.status == 200), None)
            calls = [("POST", "/v1/multicast", {"to": to, "content": f"m{n}"})]
            if latest is not None:
                calls.append(("GET", f"/v1/pushes/{latest.body['push_id']}", None))
            for method, path, body in calls:
                started = loop.time()
                try:
                    resp = await http.request(method, path, json=body, headers=AUTH)
                except httpx.HTTPError as exc:
                    run.others.append(Answer(started, loop.time(), to, repr(exc)))
                    continue
                try:
                    got = resp.json()
                except ValueError:
                    got = resp.text
                retry_after = resp.headers.get("retry-after")
                run.others.append(
                    Answer(started, loop.time(), to, resp.status_code, got, retry_after)
                )
            await asyncio.sleep(0.2)


async def ended(push_ids: list[str], api: str) -> Counter[str]:
    """Each accepted job's end, waited for (the reaper takes over an orphaned one)."""
    ends: Counter[str] = Counter()
    async with httpx.AsyncClient(base_url=api, timeout=30) as http:
        for push_id in push_ids:
            for _ in range(300):
                job = (await http.get(f"/v1/pushes/{push_id}", headers=AUTH)).json()
                if job.get("status") in ("done", "failed"):
                    break
                await asyncio.sleep(0.1)
            ends[f"{job.get('status')}, {job.get('failed_batches')} failed batches"] += 1
            if job.get("status") != "done":
                print(f"job {push_id} {job.get('status')}: {job.get('error')}")
    return ends


async def replayed(ws_url: str, uid: str) -> set[str]:
    """The msg_ids a new connection of `uid` replays from its inbox."""
    async with connect(f"{ws_url}?token={token(uid)}") as ws:
        return {frame["msg_id"] for frame in await ready(ws)}


@pytest.mark.parametrize("how", ["sigkill", "sigstop"])
async def test_a_master_failover_under_load_answers_json_503s_and_loses_nothing(
    redis_url: str, cluster: LocalCluster, directory_db: str, how: str
) -> None:
    run = Run()
    loop = asyncio.get_running_loop()
    victim = cluster.primary_of(KeySchema(PREFIX).jobs_running())
    heir = cluster.replicas[victim][0]
    with services(redis_url, cluster, directory_db) as (api, ws_url, ps):
        async with listening(ws_url, run):
            stop = asyncio.Event()
            callers = [asyncio.create_task(caller(api, k, run, stop)) for k in range(CALLERS)]
            callers.append(asyncio.create_task(group_caller(api, run, stop)))
            callers.append(asyncio.create_task(prober(api, run, stop)))
            await asyncio.sleep(WARM_S)
            failed_at = loop.time()
            cluster.process(victim).send_signal(
                signal.SIGKILL if how == "sigkill" else signal.SIGSTOP
            )
            await asyncio.to_thread(cluster.wait_primary, heir)
            await asyncio.to_thread(cluster.wait_ok, 30, skip=(victim,))
            ok_at = loop.time()
            # Load on past the bound, and a while more.
            await asyncio.sleep(RECOVERY_S + AFTER_S)
            stop.set()
            await asyncio.gather(*callers)
        if how == "sigstop":
            cluster.resume(victim)  # it comes back as a replica of its heir
        queued = {f"u{i}": await replayed(ws_url, f"u{i}") for i in range(USERS)}
        jobs = await ended([a.body["push_id"] for a in run.others if a.status == 202], api)
        log = list(_drained(ps))

    statuses = Counter(a.status for a in run.answers)
    recovered = min(
        (
            a.ended - ok_at
            for a in run.answers
            if a.probe and a.status == 200 and a.started >= ok_at
        ),
        default=None,
    )
    slowest = max(a.ended - a.started for a in run.answers)
    last_bad = max((a.ended - ok_at for a in run.answers if a.status != 200), default=None)
    print(
        f"\n{how}: answers {dict(statuses)}; cluster ok {ok_at - failed_at:.1f} s after the "
        f"failure; first 200 of a push begun after ok {recovered} s after ok; last "
        f"non-200 ended {last_bad} s after ok; slowest answer {slowest:.1f} s"
    )
    others = Counter(a.status for a in run.others)
    print(f"{how}: multicasts and receipt reads answered {dict(others)}; jobs {dict(jobs)}")
    # Every answer is a 200 (202 for a multicast) or the documented JSON 503; a receipt
    # the failover kept from being written answers 404 (the push went out: its receipt
    # is missing, as the push service logs).
    bad = [a for a in run.answers if a.status not in (200, 503)]
    bad += [a for a in run.others if a.status not in (200, 202, 404, 503)]
    assert not bad, bad[:5]
    # Every accepted multicast ended: done, or failed with the error that stopped it.
    assert sum(jobs.values()) == others[202], jobs
    assert not [end for end in jobs if not end.startswith(("done", "failed"))], jobs
    for a in run.answers + run.others:
        if a.status == 503:
            assert isinstance(a.body, dict) and a.body["error"] == "unavailable", a.body
            assert a.retry_after is not None and int(a.retry_after) >= 1
    # Back within the bound, and every push begun after it answered 200.
    assert recovered is not None and recovered < RECOVERY_S, recovered
    late = [a for a in run.answers if a.started >= ok_at + RECOVERY_S and a.status != 200]
    assert not late, late[:5]
    # Nothing a 200 promised is lost.
    lost = []
    outcomes: Counter[str] = Counter()
    for a in run.answers:
        if a.status != 200:
            continue
        for uid in a.to:
            if uid in a.body["delivered"]:
                outcomes["delivered"] += 1
                if a.body["msg_id"] not in run.got[uid]:
                    lost.append((uid, "delivered", a.body))
            elif uid in a.body["queued"]:
                phase = (
                    "before" if a.ended < failed_at else "during" if a.ended < ok_at else "after"
                )
                kind = "offline" if uid in a.body["offline"] else "failed"
                outcomes[f"queued ({kind}, {phase})"] += 1
                if a.body["msg_id"] not in queued[uid] | run.got[uid]:
                    lost.append((uid, "queued", a.body))
            else:
                outcomes["failed"] += 1
    print(f"{how}: recipients of 200s {dict(outcomes)}; lost {len(lost)}")
    assert not lost, lost[:5]
    assert outcomes["delivered"] > 0
    # Nothing untyped: no traceback in the push service's output.
    assert not [line for line in log if "Traceback" in line], "\n".join(log[-80:])


def _drained(proc: Proc) -> Iterator[str]:
    assert proc.lines is not None
    while not proc.lines.empty():
        line = proc.lines.get()
        if line is not None:
            yield line
