"""The quick-start walk-through, as a user runs it: `imroute dev --gateways 4 --groups 2`,
`examples/clients.py` dispatching clients, a drain of one gateway, and the clients
moving to the others. Real processes throughout."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from router.processes.ports import free_port_block
from tests.integration.procs import BIN, Proc, base_env, dev_started, read_until, running

pytestmark = pytest.mark.integration

CLIENTS = Path(__file__).resolve().parents[2] / "examples" / "clients.py"
COUNT = 200


def reports(proc: Proc, until: Any, timeout: float = 30.0) -> dict[str, Any]:
    """The clients' JSON reports, up to the first one `until` accepts (within `timeout`)."""
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while (left := deadline - time.monotonic()) > 0:
        last = json.loads(read_until(proc, '"t":', left)[-1])
        if until(last):
            return last
    raise AssertionError(f"the clients never got there; last report: {last}")


def test_clients_dispatch_then_move_off_a_drained_gateway(
    prefix: str, redis_url: str, tmp_path: Path
) -> None:
    port = free_port_block([0, 1, 2, 3, 4, 1001, 1002, 1003, 1004])
    env = base_env(
        IMROUTE_REDIS_URL=redis_url,
        IMROUTE_REDIS_PREFIX=prefix,
        IMROUTE_DB_URL=f"sqlite+aiosqlite:///{tmp_path}/users.db",
        IMROUTE_DRAIN_WINDOW_S="1",
    )
    argv = [str(BIN / "imroute"), "dev", "--gateways", "4", "--groups", "2", "--port", str(port)]
    with running(argv, env) as dev:
        banner, key, admin, secret = dev_started(dev)
        assert admin != key  # dev generated both: two roles
        # The Redis it found is named: dev writes its keys there.
        assert f"Redis:     {redis_url}   (already running" in banner, banner
        api = f"http://127.0.0.1:{port}"
        client_argv = [sys.executable, str(CLIENTS), "--api", api, "--count", str(COUNT),
                       "--json", "--every", "0.3"]  # fmt: skip

        # A wrong secret is named, and the script stops with 2.
        wrong = subprocess.run(
            [*client_argv, "--duration", "5"],
            env=base_env(IMROUTE_SECRET="not-the-secret-" + "x" * 20),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert wrong.returncode == 2, wrong.stderr
        assert "401" in wrong.stderr and "IMROUTE_SECRET" in wrong.stderr

        with running(client_argv, base_env(IMROUTE_SECRET=secret)) as clients:
            placed = reports(clients, lambda s: s["connected"] == COUNT)
            spread = placed["gateways"]
            assert set(spread) == {"gw1", "gw2", "gw3", "gw4"}, spread
            # Two groups, each with half the users or so (consistent hash by uid).
            assert all(COUNT * 0.35 < spread[a] + spread[b] < COUNT * 0.65
                       for a, b in (("gw1", "gw3"), ("gw2", "gw4")))  # fmt: skip
            on_gw1 = spread["gw1"]

            request = urllib.request.Request(
                f"{api}/v1/gateways/gw1/drain",
                method="POST",
                headers={"Authorization": f"Bearer {admin}"},
            )
            with urllib.request.urlopen(request) as resp:
                assert resp.status == 202
            moved = reports(
                clients,
                lambda s: s["connected"] == COUNT and "gw1" not in s["gateways"],
            )
            assert moved["moves"] == on_gw1 and moved["told"] == on_gw1, moved
            # gw1's group is g1 (with gw3): its users stay in their group.
            assert moved["gateways"]["gw3"] == spread["gw3"] + on_gw1, moved
            clients.send_signal(signal.SIGINT)
            assert clients.wait(10) == 0
        read_until(dev, "gw1 drained and exited", timeout=15)
        assert dev.poll() is None  # the rest of the stack keeps running
        dev.send_signal(signal.SIGINT)
        assert dev.wait(20) == 0
