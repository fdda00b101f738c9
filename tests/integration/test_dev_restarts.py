"""`imroute dev` restarts a child that dies (SIGKILL), with backoff, and keeps the rest."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from router.processes.ports import free_port_block
from router.processes.supervisor import alive
from tests.integration.procs import BIN, base_env, pid_of, read_until, running
from tests.integration.stack import ready

pytestmark = pytest.mark.integration


def push(port: int, key: str, uid: str) -> dict[str, object]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/push",
        data=json.dumps({"to": [uid], "content": "back"}).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request) as resp:
        answer: dict[str, object] = json.loads(resp.read())
        return answer


async def test_a_sigkilled_gateway_is_restarted_and_serves_again(
    prefix: str, tmp_path: Path
) -> None:
    port = free_port_block([0, 1, 2, 1001, 1002])
    env = base_env(
        IMROUTE_REDIS_PREFIX=prefix,
        IMROUTE_DB_URL=f"sqlite+aiosqlite:///{tmp_path}/users.db",
        IMROUTE_API_KEY="restart-test-api-key-0123",
        IMROUTE_SECRET="restart-test-secret-0123456789abcdef",
    )
    with running([str(BIN / "imroute"), "dev", "--port", str(port)], env) as dev:
        banner = "\n".join(read_until(dev, "Ctrl-C stops everything", timeout=60))
        ws_url = re.search(r"gw1 group=g1 ws=(\S+)", banner)
        assert ws_url, banner
        first, other = pid_of(dev.pid, "gw1"), pid_of(dev.pid, "gw2")

        os.kill(first, signal.SIGKILL)
        said = "\n".join(read_until(dev, "gw1 restarted", timeout=15))
        assert "gw1 exited with code -9; restarting it in 1s" in said
        second = pid_of(dev.pid, "gw1")
        assert second != first
        os.kill(second, signal.SIGKILL)  # dies again soon after: the backoff doubles
        said = "\n".join(read_until(dev, "gw1 restarted", timeout=15))
        assert "gw1 exited with code -9; restarting it in 2s" in said
        assert alive(other) and pid_of(dev.pid, "gw2") == other  # the rest kept running
        assert dev.poll() is None

        tok = subprocess.run(
            [str(BIN / "imroute"), "token", "carl"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        deadline = time.monotonic() + 20
        while True:  # the new gateway binds its port once it has started
            try:
                ws = await connect(f"{ws_url.group(1)}?token={tok}")
                break
            except OSError:
                assert time.monotonic() < deadline, "gw1 did not come back"
                await asyncio.sleep(0.2)
        async with ws:
            await ready(ws)
            for _ in range(100):  # until the new gateway is in the fleet and has the route
                body = await asyncio.to_thread(push, port, env["IMROUTE_API_KEY"], "carl")
                if body["delivered"]:
                    break
                await asyncio.sleep(0.1)
            assert body["delivered"] == ["carl"], body
            frame = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert frame["content"] == "back"
        dev.send_signal(signal.SIGINT)
        assert dev.wait(20) == 0
