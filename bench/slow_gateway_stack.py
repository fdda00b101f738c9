"""The slow-gateway bench's children and probes: the four gateways in one process, the
WebSocket clients in another, and what the parent reads off the stack (readiness,
/metrics, this run's Redis commands)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
import redis

from bench.harness.clients import spec_pool, uid_of
from bench.harness.link import emit, stdin_commands
from bench.harness.stack import HOST, BenchError, run_loop
from bench.harness.workers import serve_worker
from bench.slow_gateway_report import GATEWAYS, REDIS_SAMPLE_S
from shared.keys import KeySchema

if TYPE_CHECKING:
    import redis.asyncio as aioredis
    from websockets.asyncio.client import ClientConnection

__all__ = [
    "clients_main",
    "gateways_main",
    "sample_redis",
    "scrape_metrics",
    "wait_push_service",
]

GROUP = "g1"
READY_TIMEOUT_S = 30.0
METRIC_NAMES = (
    "imroute_gateway_call_attempts_total",
    "imroute_gateway_call_retries_total",
    "imroute_gateway_calls_failed_total",
)


def gateways_main(spec: dict[str, Any]) -> int:
    """The gateways process: gw1..gw4 in one event loop; 'stats' answers their counters."""
    run_loop(_gateways(spec))
    return 0


async def _gateways(spec: dict[str, Any]) -> None:
    from shared.settings import Settings
    from socket_gateway.app import Gateway
    from socket_gateway.faults import DelayCalls

    async with AsyncExitStack() as stack:
        gateways: dict[str, Gateway] = {}
        delays: dict[str, DelayCalls] = {}
        for gid, ws_port, grpc_port, delay_s in spec["gateways"]:
            settings = Settings.load(
                os.environ,
                gateway_id=gid,
                group_id=GROUP,
                ws_host=HOST,
                ws_port=ws_port,
                grpc_host=HOST,
                grpc_port=grpc_port,
            )
            interceptors = []
            if delay_s > 0:
                interceptors.append(delays.setdefault(gid, DelayCalls(delay_s)))
            gateways[gid] = await stack.enter_async_context(Gateway(settings, None, interceptors))
        emit(event="ready", ws_ports={gid: gw.ws_port for gid, gw in gateways.items()})
        async for cmd in stdin_commands():
            if cmd["cmd"] == "delay":  # the same interceptor, its delay switched off or on
                for delay in delays.values():
                    delay.seconds = float(cmd["seconds"])
                emit(event="delay", seconds=cmd["seconds"])
            elif cmd["cmd"] == "stats":
                emit(
                    event="stats",
                    gateways={
                        gid: {
                            "calls": gw.deliver_service.calls,
                            "batches": gw.deliver_service.batches,
                            "connections": len(gw.conns),
                        }
                        for gid, gw in gateways.items()
                    },
                )


@dataclass
class Tally:
    """What the clients received since the last dump."""

    by_seq: dict[int, int] = field(default_factory=dict)
    by_uid: dict[str, int] = field(default_factory=dict)
    bad: int = 0
    warmup: int = 0


def clients_main(spec_json: str) -> int:
    """The client process: connects on 'go'; counts push frames per seq and per uid."""
    return serve_worker(_clients, spec_json)


async def _clients(spec: dict[str, Any]) -> None:
    tally = Tally()

    def on_frame(conn: ClientConnection, now: float, data: bytes) -> None:
        try:
            seq = int(json.loads(data)["content"]["seq"])
        except (ValueError, KeyError, TypeError):
            tally.bad += 1
            return
        if seq < 0:
            tally.warmup += 1
            return
        tally.by_seq[seq] = tally.by_seq.get(seq, 0) + 1
        k = pool.owner.get(conn)  # which client: set once its handshake has returned
        uid = "?" if k is None else uid_of(k)
        tally.by_uid[uid] = tally.by_uid.get(uid, 0) + 1

    pool = spec_pool(spec, on_frame)
    async for cmd in stdin_commands():
        if cmd["cmd"] == "go":
            started = time.monotonic()
            failed = await pool.start()
            emit(event="ready", failed=failed, seconds=time.monotonic() - started)
        elif cmd["cmd"] == "count":
            emit(event="count", n=sum(tally.by_seq.values()))
        elif cmd["cmd"] == "dump":
            seqs = list(tally.by_seq)
            state = {
                "open": pool.open,
                "try_again": pool.stats["try_again"],
                "closed": pool.stats["closed"],
            }
            emit(
                event="dump",
                seqs=seqs,
                counts=[tally.by_seq[s] for s in seqs],
                by_uid=tally.by_uid,
                bad=tally.bad,
                warmup=tally.warmup,
                **state,
            )
            tally = Tally()
    pool.stop()
    # Leave without closing handshakes: the OS closes the sockets when the process exits.
    os._exit(0)


async def wait_push_service(
    http: httpx.AsyncClient, api_key: str, is_up: Callable[[], None]
) -> None:
    """Until the push service answers and lists every gateway as live."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        is_up()
        try:
            resp = await http.get(
                "/v1/gateways", headers={"Authorization": f"Bearer {api_key}"}, timeout=1
            )
            live = {g["gateway_id"] for g in resp.json()["gateways"]}
            if set(GATEWAYS) <= live:
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        await asyncio.sleep(0.1)
    raise BenchError(f"the push service was not ready within {READY_TIMEOUT_S:.0f}s")


async def scrape_metrics(http: httpx.AsyncClient) -> dict[str, float]:
    """The per-gateway call counters from the push service's /metrics."""
    try:
        text = (await http.get("/metrics", timeout=5)).text
    except httpx.HTTPError as exc:
        raise BenchError(f"could not read the push service's /metrics: {exc}") from None
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(METRIC_NAMES):
            m = re.fullmatch(r"(\w+)\{(.*)\} (\S+)", line)
            if m:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', m[2]))
                name = m[1].removeprefix("imroute_gateway_").removesuffix("_total")
                out[f"{name}[{','.join(labels.values())}]"] = float(m[3])
    return out


async def sample_redis(url: str, prefix: str, after_s: float) -> dict[str, float]:
    """This run's Redis commands during a short window, by kind, counted with MONITOR.

    INFO commandstats counts the whole server, which other sessions' tests share; MONITOR
    shows each command's keys, so only this run's prefix is counted. It costs Redis some
    work while it runs, hence a short window.
    """
    import redis.asyncio as aioredis

    await asyncio.sleep(after_s)
    counts = {"fleet reads": 0, "route look-ups": 0, "all": 0}
    client = aioredis.from_url(url, decode_responses=True)
    try:
        await _count_commands(client, prefix, counts)
    except (redis.RedisError, OSError):
        return {}  # the figure is left out; the run itself is still good
    finally:
        await client.aclose()
    return {k: v / REDIS_SAMPLE_S for k, v in counts.items()}


async def _count_commands(client: aioredis.Redis, prefix: str, counts: dict[str, int]) -> None:
    fleet_key = KeySchema(prefix).gateways()
    async with client.monitor() as monitor:
        end = time.monotonic() + REDIS_SAMPLE_S
        while (left := end - time.monotonic()) > 0:
            try:
                info = await asyncio.wait_for(monitor.next_command(), left)
            except TimeoutError:
                break
            command = info["command"]
            if prefix not in command:
                continue
            counts["all"] += 1
            if info["client_type"] == "lua":
                continue  # inside a script, e.g. the gateways' route refresh every 20 s
            verb = command.split(" ", 1)[0].upper()
            if verb == "ZRANGEBYSCORE" and fleet_key in command:
                counts["fleet reads"] += 1
            elif verb == "HGETALL":
                counts["route look-ups"] += 1
