"""Configuration traps, each met by a real process: a Redis Cluster without a bus, and a
gateway bound to a wildcard address with nothing to announce."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess

import pytest

from router.processes.supervisor import Supervisor
from tests.conftest import API_KEY, SECRET
from tests.integration.procs import BIN, base_env, gateway_env, read_until, running

TOKEN = "t" * 40
CLUSTER = "redis+cluster://:pw-hunter2@127.0.0.1:7000"


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("argv", "workers"),
    [(["push-service"], "1"), (["push-service"], "2"), (["gateway", "--ws-port", "0"], "1")],
)
def test_a_redis_cluster_without_a_bus_is_one_line_naming_the_fix_and_exit_2(
    argv: list[str], workers: str
) -> None:
    result = _run(
        [str(BIN / "imroute"), *argv],
        base_env(
            IMROUTE_REDIS_URL=CLUSTER,
            IMROUTE_API_KEY=API_KEY,
            IMROUTE_SECRET=SECRET,
            IMROUTE_WORKERS=workers,
        ),
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr  # no traceback
    assert "IMROUTE_BUS_URL" in lines[0] and "redis+cluster://" in lines[0]
    assert "redis://HOST:6379/0" in lines[0] and "pubsub://PROJECT" in lines[0]
    assert "memory://" not in lines[0]  # which IMROUTE_BUS_URL refuses
    assert "pw-hunter2" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("pubsub://trial", "'trial' is not a Google Cloud project id"),
        ("pubsub://trial-pubsub", "found no Google credentials"),  # nor an emulator
        ("kafka://h:9092", "IMROUTE_BUS_URL: must start with redis://"),
    ],
)
@pytest.mark.parametrize(
    ("argv", "workers"),
    [(["push-service"], "1"), (["push-service"], "2"), (["gateway", "--ws-port", "0"], "1")],
)
def test_a_bus_that_cannot_be_reached_is_one_line_and_exit_2(
    argv: list[str], workers: str, url: str, named: str
) -> None:
    """The Pub/Sub trial: the push service raised these in its app's start, a traceback
    per worker and exit 3, where the gateway said one line and exited 2."""
    env = base_env(
        IMROUTE_BUS_URL=url, IMROUTE_API_KEY=API_KEY, IMROUTE_SECRET=SECRET, IMROUTE_WORKERS=workers
    )
    env.pop("PUBSUB_EMULATOR_HOST", None)
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    result = _run([str(BIN / "imroute"), *argv], env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], result.stderr  # no traceback


def _netns() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs root, unshare and ip (a network namespace of the test's own)")


def _gateway_argv(*extra: str) -> list[str]:
    return [str(BIN / "python"), "-m", "socket_gateway", "--ws-port", "0", "--grpc-port", "0",
            *extra]  # fmt: skip


def test_a_wildcard_bind_on_a_host_with_no_address_to_announce_is_refused() -> None:
    _netns()
    # A namespace with loopback only: the old guess announced 127.0.0.1 without a word.
    argv = ["unshare", "-n", *_gateway_argv("--ws-host", "0.0.0.0", "--grpc-host", "0.0.0.0")]
    result = _run(argv, base_env(IMROUTE_SECRET=SECRET, IMROUTE_INTERNAL_TOKEN=TOKEN))
    assert result.returncode == 2, result.stderr
    assert "--advertise-host (IMROUTE_ADVERTISE_HOST): required" in result.stderr
    assert "no address beyond loopback" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_wildcard_bind_announces_the_hosts_one_address(prefix: str) -> None:
    _netns()
    # A namespace whose one address beyond loopback is 10.9.8.7 (a veth end), whose host
    # name resolves to loopback, with a Redis of its own.
    port = "6399"
    script = (
        "set -e; ip link set lo up; ip link add v0 type veth peer name v1; "
        "ip addr add 10.9.8.7/24 dev v0; ip link set v0 up; "
        f"{BIN}/redis-server --port {port} --bind 127.0.0.1 --save '' --appendonly no "
        "--daemonize no >/dev/null & "
        f"until {BIN}/redis-cli -p {port} ping >/dev/null 2>&1; do sleep 0.05; done; "
        "exec " + " ".join(_gateway_argv("--ws-host", "0.0.0.0", "--grpc-host", "0.0.0.0"))
    )
    env = gateway_env(f"redis://127.0.0.1:{port}/0", prefix, IMROUTE_INTERNAL_TOKEN=TOKEN)
    with Supervisor(env) as sup:
        # whole_group: the namespace's Redis goes with the gateway
        gw = sup.start("gw", ["unshare", "-n", "bash", "-c", script],
                       stdout="lines", stderr="stdout", whole_group=True)  # fmt: skip
        lines = read_until(gw, " ready ", 60)
    ready = lines[-1]
    assert re.search(r"ws=ws://10\.9\.8\.7:[0-9]+/ws grpc=10\.9\.8\.7:[0-9]+", ready), lines


def test_a_loopback_advertise_host_for_an_open_port_is_a_warning(
    redis_url: str, prefix: str
) -> None:
    env = gateway_env(redis_url, prefix, IMROUTE_INTERNAL_TOKEN=TOKEN)
    argv = _gateway_argv("--ws-host", "0.0.0.0", "--grpc-host", "0.0.0.0",
                         "--advertise-host", "127.0.0.1")  # fmt: skip
    with running(argv, env) as gw:
        lines = read_until(gw, " ready ", 60)
    warning = [line for line in lines if "IMROUTE_ADVERTISE_HOST is 127.0.0.1" in line]
    assert warning and "WARNING" in warning[0], lines
    assert "ws=ws://127.0.0.1:" in lines[-1]


def test_a_grpc_port_taken_is_one_line_naming_the_setting_and_exit_1(
    redis_url: str, prefix: str
) -> None:
    """Before: a 40-line traceback ("Failed to bind to address"), naming no setting; a
    WebSocket or metrics port taken was already one line."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [str(BIN / "python"), "-m", "socket_gateway", "--id", "gwp", "--group", "g1",
                "--ws-port", "0", "--grpc-host", "127.0.0.1", "--grpc-port", str(port)]  # fmt: skip
        result = _run(argv, gateway_env(redis_url, prefix))
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    [said] = [line for line in result.stderr.splitlines() if "imroute gateway" in line]
    assert "IMROUTE_GRPC_PORT" in said and f"127.0.0.1:{port}" in said, said
