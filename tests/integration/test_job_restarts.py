"""A rolling restart of the push service during a 100k-user broadcast loses no batch.

Real processes: two gateways and the push service (`python -m push_service`), on one
real Redis (routes, jobs, Redis Streams) and a SQLite directory of 100,000 users. The
push service is stopped while its broadcast runs, with SIGTERM (it hands the job over at
its next page) or SIGKILL (its lease lapses); a second push service resumes the job from
its checkpoint. A watcher subscribed to the bus sees every one of the 100 batches, the
clients spread over the directory each get the push once, and the job ends done with the
full count.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from router.bus.redis_streams import RedisStreamsBus
from router.directory.base import MAX_UPSERT, UserRecord
from router.directory.migrate import upgrade
from router.directory.sql import SqlUserDirectory
from router.processes.ports import free_port_block
from router.routes.base import LOOKUP_CHUNK
from shared.clock import SystemClock
from shared.keys import KeySchema
from shared.proto import gateway_pb2
from tests.conftest import API_KEY, SECRET
from tests.integration.procs import BIN, Proc, base_env, read_until, running
from tests.integration.stack import AUTH, ready, token

pytestmark = pytest.mark.integration

USERS = 100_000
# Pages of 250 (IMROUTE_BATCH_SIZE): 400 of them, so that a broadcast is still publishing
# well after its third page, however fast a publish is (one round trip each).
PAGE = 250
PAGES = USERS // PAGE
CLIENTS = 200  # one per two pages, split over the two gateways
MULTICAST_TO = 300_000  # uids a multicast is sent to (CLIENTS of them online)


def uid(i: int) -> str:
    return f"u{i:06d}"


async def fill(db_url: str) -> None:
    await upgrade(db_url)
    async with SqlUserDirectory.from_url(db_url, SystemClock()) as directory:
        for start in range(0, USERS, MAX_UPSERT):
            await directory.upsert([UserRecord(uid(i)) for i in range(start, start + MAX_UPSERT)])


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite directory of USERS users, filled once for the module; tests copy it."""
    path = tmp_path_factory.mktemp("directory") / "users.db"
    asyncio.run(fill(f"sqlite+aiosqlite:///{path}"))
    return path


@contextmanager
def push_service(env: dict[str, str], port: int) -> Iterator[tuple[Proc, list[str]]]:
    """A push service once it listens, and the lines it wrote until then (its reaper may
    have taken a job over before uvicorn said it listens)."""
    argv = [str(BIN / "python"), "-m", "push_service", "--port", str(port)]
    with running(argv, env) as proc:
        yield proc, read_until(proc, "Uvicorn running on", timeout=30)


@asynccontextmanager
async def watching(redis_url: str, prefix: str) -> AsyncIterator[list[gateway_pb2.Batch]]:
    """Every broadcast batch on the bus, as one more subscriber sees them."""
    seen: list[gateway_pb2.Batch] = []
    async with RedisStreamsBus(redis_url, prefix) as bus:
        await bus.prepare(["broadcast"], "watcher")

        async def read() -> None:
            async for received in bus.subscribe(["broadcast"], "watcher"):
                seen.append(gateway_pb2.Batch.FromString(received.data))
                await received.ack()

        task = asyncio.create_task(read())
        try:
            yield seen
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def listen(ws: ClientConnection, pushes: list[dict[str, Any]]) -> None:
    with contextlib.suppress(ConnectionClosed):  # the gateways stop first at the end
        async for data in ws:
            frame = json.loads(data)
            if frame["type"] == "push":
                pushes.append(frame)


RECORD = ("status", "published", "checkpoint")


async def job_of_redis(redis_url: str, prefix: str, push_id: str) -> dict[str, str]:
    """What the job's record says of its progress, read from Redis (not the spec, which
    holds a multicast's whole `to` list)."""
    client = aioredis.from_url(redis_url, decode_responses=True)
    try:
        values = await client.hmget(KeySchema(prefix).job(push_id), RECORD)
        return {k: str(v) for k, v in zip(RECORD, values, strict=True) if v is not None}
    finally:
        await client.aclose()


async def job_of(http: httpx.AsyncClient, push_id: str) -> dict[str, Any]:
    answer: dict[str, Any] = (await http.get(f"/v1/pushes/{push_id}", headers=AUTH)).json()
    return answer


@asynccontextmanager
async def clients(env: dict[str, str]) -> AsyncIterator[dict[str, list[dict[str, Any]]]]:
    """Two gateways of one group and CLIENTS clients spread over the directory's uids,
    split between them: the pushes each client gets, by uid."""
    gateway_argv = [str(BIN / "imroute"), "gateway", "--ws-port", "0", "--grpc-port", "0"]
    with (
        running([*gateway_argv, "--id", "gw1", "--group", "g1"], env) as gw1,
        running([*gateway_argv, "--id", "gw2", "--group", "g1"], env) as gw2,
    ):
        urls = []
        for gw in (gw1, gw2):
            found = re.search(r"ws=(\S+)", read_until(gw, "ready")[-1])
            assert found
            urls.append(found.group(1))
        pushes: dict[str, list[dict[str, Any]]] = {}
        async with AsyncExitStack() as stack:
            listeners = []
            for n in range(CLIENTS):
                who = uid(n * (USERS // CLIENTS) + n % 7)
                ws = await stack.enter_async_context(
                    connect(f"{urls[n % 2]}?token={token(who)}", max_queue=None)
                )
                await ready(ws)
                pushes[who] = []
                listeners.append(asyncio.create_task(listen(ws, pushes[who])))
            try:
                yield pushes
            finally:
                for task in listeners:
                    task.cancel()


def job_env(redis_url: str, prefix: str, db_url: str) -> dict[str, str]:
    return base_env(
        IMROUTE_REDIS_URL=redis_url,
        IMROUTE_REDIS_PREFIX=prefix,
        IMROUTE_SECRET=SECRET,
        IMROUTE_API_KEY=API_KEY,
        IMROUTE_DB_URL=db_url,
        IMROUTE_JOB_LEASE_S="1",
        IMROUTE_JOB_SHUTDOWN_GRACE_S="0",  # hand every job over at once
        IMROUTE_GATEWAY_CACHE_S="0",
        IMROUTE_BATCH_SIZE=str(PAGE),
    )


async def stop_and_resume(
    env: dict[str, str],
    stop: signal.Signals,
    post: tuple[str, dict[str, Any]],
    stop_when: Callable[[dict[str, str]], bool],
) -> tuple[str, dict[str, str], dict[str, Any], str]:
    """POST the job (path, body) to a push service, stop it with `stop` once its record
    says `stop_when`, start a second one on its port: (push id, the record the first
    left, the job's end, the second's log)."""
    port = free_port_block([0])
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        return await _stop_and_resume(env, http, port, stop, post, stop_when)


async def _stop_and_resume(
    env: dict[str, str],
    http: httpx.AsyncClient,
    port: int,
    stop: signal.Signals,
    post: tuple[str, dict[str, Any]],
    stop_when: Callable[[dict[str, str]], bool],
) -> tuple[str, dict[str, str], dict[str, Any], str]:
    with push_service(env, port) as (first, _):
        resp = await http.post(post[0], json=post[1], headers=AUTH)
        assert resp.status_code == 202, resp.text
        push_id = resp.json()["push_id"]
        redis_url, prefix = env["IMROUTE_REDIS_URL"], env["IMROUTE_REDIS_PREFIX"]
        for _ in range(4000):
            # Paused while its record is read, so that the job cannot run on to its end
            # between the read and the stop (a whole job takes well under a second).
            first.send_signal(signal.SIGSTOP)
            if stop_when(await job_of_redis(redis_url, prefix, push_id)):
                break
            first.send_signal(signal.SIGCONT)
            await asyncio.sleep(0.005)
        first.send_signal(stop)
        first.send_signal(signal.SIGCONT)
        first.wait(15)
    # It stopped before the end: SIGTERM handed the job over, SIGKILL left it running
    # under a lease that lapses.
    left = await job_of_redis(redis_url, prefix, push_id)
    assert left["status"] == ("queued" if stop == signal.SIGTERM else "running"), left
    with push_service(env, port) as (second, started):
        for _ in range(1500):
            job = await job_of(http, push_id)
            if job["status"] in ("done", "failed"):
                break
            await asyncio.sleep(0.02)
        said = [line for line in started if "resuming job" in line]
        resumed = "\n".join(said or read_until(second, "resuming job", timeout=1))
    return push_id, left, job, resumed


STOPS = pytest.mark.parametrize(
    "stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"]
)


@STOPS
async def test_a_restart_during_a_broadcast_loses_no_batch(
    redis_url: str, prefix: str, tmp_path: Path, filled: Path, stop: signal.Signals
) -> None:
    shutil.copy(filled, tmp_path / "users.db")
    env = job_env(redis_url, prefix, f"sqlite+aiosqlite:///{tmp_path}/users.db")
    async with clients(env) as pushes, watching(redis_url, prefix) as batches:
        push_id, left, job, resumed = await stop_and_resume(
            env,
            stop,
            ("/v1/broadcast", {"content": {"n": 1}}),
            lambda on: int(on.get("published", 0)) >= 3,  # a few pages in
        )
        for _ in range(250):
            if all(pushes.values()) and len({b.batch_id for b in batches}) >= PAGES:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)  # time for a duplicate to show, if any came
    assert 3 <= int(left["published"]) < PAGES, left
    assert f"resuming job {push_id} (broadcast)" in resumed
    assert job["status"] == "done", job
    assert (job["recipients"], job["batches"], job["published"]) == (USERS, PAGES, PAGES)
    assert (job["failed_batches"], job["failed"]) == (0, [])
    # Every batch reached the bus; a page published again (after a SIGKILL) kept its id.
    by_id: dict[str, set[str]] = {}
    for batch in batches:
        assert batch.message.push_id == push_id
        by_id.setdefault(batch.batch_id, set()).update(batch.uids)
    assert len(by_id) == PAGES
    assert sorted(u for uids in by_id.values() for u in uids) == [uid(i) for i in range(USERS)]
    # Each client got the push exactly once (the gateways dropped any repeated batch).
    assert {who: len(got) for who, got in pushes.items()} == dict.fromkeys(pushes, 1)
    assert {got[0]["push_id"] for got in pushes.values()} == {push_id}


@STOPS
async def test_a_restart_during_a_multicast_resumes_it_from_its_checkpoint(
    redis_url: str, prefix: str, tmp_path: Path, stop: signal.Signals
) -> None:
    """A multicast to MULTICAST_TO uids, stopped after its first checkpoint: the second
    push service runs it on from there. After SIGTERM (a hand-over at a checkpoint)
    nothing is sent twice; after SIGKILL, the chunks after the last checkpoint are sent
    again under the same msg_id, which a client may get twice (the SDKs drop it)."""
    env = job_env(redis_url, prefix, f"sqlite+aiosqlite:///{tmp_path}/users.db")
    to = [uid(i) for i in range(MULTICAST_TO)]
    async with clients(env) as pushes:
        push_id, left, job, resumed = await stop_and_resume(
            env,
            stop,
            ("/v1/multicast", {"to": to, "content": {"n": 2}}),
            lambda on: "checkpoint" in on,
        )
        for _ in range(250):
            if all(pushes.values()):
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)  # time for a duplicate to show, if any came
    at = json.loads(left["checkpoint"])
    assert 0 < at["pages"] < len(to) // LOOKUP_CHUNK, at
    assert f"resuming job {push_id} (multicast)" in resumed
    assert job["status"] == "done", job
    assert (job["recipients"], job["online"]) == (len(to), CLIENTS), job
    assert job["offline"] == len(to) - CLIENTS
    assert (job["failed_batches"], job["failed"]) == (0, [])
    copies = {who: len(got) for who, got in pushes.items()}
    if stop == signal.SIGTERM:
        assert copies == dict.fromkeys(pushes, 1)
    else:
        assert set(copies.values()) <= {1, 2}, copies
    assert len({(g["msg_id"], g["push_id"]) for got in pushes.values() for g in got}) == 1
