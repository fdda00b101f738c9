"""IMROUTE_LOG_FORMAT=text (the default): every line a real push service (two workers
and their supervisor), a real gateway and `imroute dev` write starts with its time (UTC,
ISO 8601, ms), uvicorn's lines and the "ready" lines included (the push service's text
lines used to have none)."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from router.processes.ports import free_port, free_port_block
from tests.conftest import API_KEY, SECRET
from tests.integration.procs import BIN, base_env, gateway_env, read_until, running, service_env

pytestmark = pytest.mark.integration

TIMED = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \S")


def _untimed(lines: list[str]) -> list[str]:
    return [line for line in lines if line.strip() and not TIMED.match(line)]


def _push(port: int) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/push",
        data=b'{"to":["nobody"],"content":{}}',
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_every_line_of_the_push_service_and_a_gateway_starts_with_its_time(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    port = free_port()
    env = service_env(
        redis_url,
        prefix,
        tmp_path,
        IMROUTE_SECRET=SECRET,
        IMROUTE_PORT=str(port),
        IMROUTE_WORKERS="2",
        # a warning of our own code (429s counted), which had no handler in text mode
        IMROUTE_RATE_LIMIT="1/s",
        IMROUTE_RATE_BURST="1",
    )
    argv = [str(BIN / "python"), "-m", "push_service"]
    with running(argv, env) as proc:
        lines = read_until(proc, "Uvicorn running on", 60)
        lines += read_until(proc, "Application startup complete", 60)
        lines += read_until(proc, "Application startup complete", 60)  # both workers
        statuses = [_push(port) for _ in range(3)]
        assert 429 in statuses, statuses
        lines += read_until(proc, "requests over IMROUTE_RATE_LIMIT refused (429)", 10)
    assert not _untimed(lines), lines
    assert any("WARNING push_service.ratelimit" in line for line in lines), lines

    gw_argv = [str(BIN / "python"), "-m", "socket_gateway", "--ws-port", "0",
               "--grpc-port", "0"]  # fmt: skip
    gw_env = gateway_env(redis_url, prefix)
    with running(gw_argv, gw_env) as gw:
        lines = read_until(gw, " ready ", 60)
    assert not _untimed(lines), lines


def test_every_line_of_imroute_dev_but_its_banner_starts_with_its_time(
    prefix: str, tmp_path: Path
) -> None:
    port = free_port_block([0, 1, 1001])
    env = base_env(
        IMROUTE_REDIS_URL="redis://127.0.0.1:1/0",  # none there: dev starts its own
        IMROUTE_REDIS_PREFIX=prefix,
        IMROUTE_DB_URL=f"sqlite+aiosqlite:///{tmp_path}/users.db",
    )
    argv = [str(BIN / "imroute"), "dev", "--port", str(port), "--gateways", "1",
            "--groups", "1"]  # fmt: skip
    with running(argv, env) as dev:
        lines = read_until(dev, "imroute dev is up.", 60)
        time.sleep(0.5)
    before_banner = lines[:-1]
    assert any("started an embedded one" in line for line in before_banner), lines
    assert any("bus: " in line for line in before_banner), lines
    assert not _untimed(before_banner), lines
