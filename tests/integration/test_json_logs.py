"""IMROUTE_LOG_FORMAT=json: every line a real push service (two workers and their
supervisor) and a real gateway process write is one JSON object, and the lines about a
push name its push_id and msg_id, a batch's its batch_id, a gateway's its gateway_id.
Real Redis, real processes, a real WebSocket client."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import connect

from router.fleet.store import RedisGatewayFleet
from router.processes.ports import free_port, free_port_block
from router.routes.registry import RedisRouteRegistry, Registration
from shared.clock import SystemClock
from shared.keys import KeySchema
from shared.models import GatewayInfo
from tests.conftest import API_KEY, SECRET
from tests.integration.procs import BIN, base_env, imroute, read_until, running, service_env
from tests.integration.stack import AUTH, ready, recv_json, token
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

KEYS = {"ts", "level", "logger", "message", "process", "pid"}


def _objects(lines: list[str]) -> list[dict[str, Any]]:
    """Each line as the JSON object it must be."""
    objects = []
    for line in lines:
        if not line.strip():
            continue
        obj = json.loads(line)  # fails the test, naming the line, if it is not JSON
        assert isinstance(obj, dict) and set(obj) >= KEYS, line
        objects.append(obj)
    return objects


async def test_every_line_is_json_and_names_the_push_the_batch_and_the_gateway(
    redis_url: str, prefix: str, redis: aioredis.Redis, tmp_path: Any
) -> None:
    env = service_env(
        redis_url,
        prefix,
        tmp_path,
        IMROUTE_SECRET=SECRET,
        IMROUTE_LOG_FORMAT="json",
        IMROUTE_LOG_LEVEL="debug",
    )
    keys, clock = KeySchema(prefix), SystemClock()
    # A gateway that is gone: its record and a user's route remain, nothing listens.
    dead = free_port_block([0])
    await RedisGatewayFleet(redis, keys, clock, ttl_s=30).announce(  # type: ignore[arg-type]
        GatewayInfo("gwdead", "g1", "ws://x/ws", f"127.0.0.1:{dead}", 1, clock.now_ms())
    )
    registry = RedisRouteRegistry(redis, keys, clock, gateway_id="gwdead", group_id="g1",
                                  ip="127.0.0.1", port=dead)  # fmt: skip
    await registry.refresh([Registration("zed", "gwdead.1")])

    port = free_port()
    push_argv = [str(BIN / "imroute"), "push-service", "--port", str(port)]
    gw_argv = [str(BIN / "imroute"), "gateway", "--id", "gwj", "--group", "g1",
               "--ws-port", "0", "--grpc-port", "0"]  # fmt: skip
    with (
        running(push_argv, {**env, "IMROUTE_WORKERS": "2"}) as push,
        running(gw_argv, env) as gw,
    ):
        # The supervisor says it listens before its workers start: until both have
        # started, a connection the kernel gave a starting worker waits in its queue.
        started = await asyncio.to_thread(read_until, push, "Uvicorn running on", 60)
        for _ in range(2):
            started += await asyncio.to_thread(read_until, push, "Application startup complete", 60)
        gw_lines = await asyncio.to_thread(read_until, gw, "ready")
        ws_url = re.search(r"ws=(\S+)", gw_lines[-1])
        assert ws_url, gw_lines[-1]
        async with connect(f"{ws_url.group(1)}?token={token('amy')}") as ws:
            await ready(ws)
            await wait_for(lambda: redis.hlen(keys.route("amy")), "amy's route", 5.0, every=0.05)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
                for _ in range(100):  # until a worker has the gateway in its fleet
                    resp = await http.post(
                        "/v1/push", json={"to": ["amy"], "content": 1}, headers=AUTH
                    )
                    if resp.status_code == 200 and resp.json()["delivered"]:
                        break
                    await asyncio.sleep(0.1)
                sent = resp.json()
                assert sent["delivered"] == ["amy"], sent
                assert (await recv_json(ws))["content"] == 1
                failed = (
                    await http.post("/v1/push", json={"to": ["zed"], "content": 2}, headers=AUTH)
                ).json()
                assert failed["failed"] == ["zed"], failed

        # The gateway's line about the batch names the push, its message, the batch and
        # itself.
        seen = _objects(gw_lines + await asyncio.to_thread(read_until, gw, sent["push_id"]))
        line = next(o for o in seen if o.get("push_id") == sent["push_id"])
        assert line["msg_id"] == sent["msg_id"] and line["batch_id"]
        assert line["gateway_id"] == "gwj" and line["process"] == "gateway"
        assert line["message"].startswith(f"batch {line['batch_id']}: 1 written")
        assert all(o["gateway_id"] == "gwj" for o in seen)  # its every line

        # The push service's line about the failed call names the push and the gateway.
        lines = started + await asyncio.to_thread(read_until, push, "deliver to gwdead failed")
        seen = _objects(lines)
        about = [o for o in seen if o.get("push_id") == failed["push_id"]]
        line = next(o for o in about if o.get("gateway_id"))
        assert line["msg_id"] == failed["msg_id"] and line["gateway_id"] == "gwdead"
        assert line["process"] == "push-service"
        # The supervisor's own lines are JSON too (the one scripts wait for included).
        assert any("Uvicorn running on" in o["message"] for o in seen)
        assert any("starting 2 workers" in o["message"] for o in seen)
        # No key in any line.
        assert not any(API_KEY in json.dumps(o) or SECRET in json.dumps(o) for o in seen)


def test_a_bad_log_format_is_refused_naming_the_setting() -> None:
    env = base_env(IMROUTE_LOG_FORMAT="xml", IMROUTE_SECRET=SECRET)
    done = imroute("gateway", "--id", "g", "--group", "g1", env=env, timeout=30)
    assert done.returncode == 2
    assert "IMROUTE_LOG_FORMAT" in done.stderr and "'text' or 'json'" in done.stderr
