"""Test-only helpers for running imroute as real subprocesses, on router.devtools.supervisor."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from pathlib import Path

import httpx

from router.devtools.ports import free_port
from router.devtools.supervisor import Child, Supervisor
from tests.conftest import SECRET

__all__ = [
    "BIN",
    "Proc",
    "base_env",
    "gateway_process",
    "push_services",
    "read_until",
    "running",
    "scrape",
]

BIN = Path(sys.executable).parent

Proc = Child  # a child whose output is read line by line (stdout and stderr together)


@contextmanager
def running(argv: list[str], env: dict[str, str]) -> Iterator[Proc]:
    """A subprocess with its output read line by line, always reaped (by PID) on exit."""
    with Supervisor(env) as children:
        yield children.start(argv[0], argv, stdout="lines", stderr="stdout")


@asynccontextmanager
async def push_services(env: dict[str, str], ports: list[int]) -> AsyncIterator[list[Proc]]:
    """One `python -m push_service` per port, each once uvicorn says it listens. Waited
    for in a thread, so that the test's loop (its in-process gateways, receivers and
    heartbeats) goes on meanwhile: a start-up can take seconds under a suite's load."""
    with ExitStack() as stack:
        procs = []
        for port in ports:
            argv = [str(BIN / "python"), "-m", "push_service", "--port", str(port)]
            procs.append(stack.enter_context(running(argv, env)))
        for proc in procs:
            await asyncio.to_thread(read_until, proc, "Uvicorn running on", 60)
        yield procs


def read_until(proc: Proc, marker: str, timeout: float = 30.0) -> list[str]:
    """Lines of output up to and including the first one containing `marker`."""
    try:
        return proc.read_until(marker, timeout)
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None


def base_env(**extra: str) -> dict[str, str]:
    """Our environment without IMROUTE_* (and OTEL_*) settings, plus `extra`. A push
    service is one process here unless `extra` says otherwise (IMROUTE_WORKERS): workers
    triple its start-up time, and tests/integration/test_workers.py runs them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMROUTE_", "OTEL_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["IMROUTE_WORKERS"] = "1"
    env.update(extra)
    return env


@asynccontextmanager
async def gateway_process(
    redis_url: str, prefix: str, gid: str = "gwp", **env: str
) -> AsyncIterator[list[int]]:
    """A real gateway (`imroute gateway`, on uvloop) with `env` (IMROUTE_*) set, once it
    says it is ready: its WebSocket, gRPC and metrics ports."""
    ports = [free_port(), free_port(), free_port()]
    argv = [str(BIN / "imroute"), "gateway", "--id", gid, "--group", "g1",
            "--ws-port", str(ports[0]), "--grpc-port", str(ports[1])]  # fmt: skip
    settings = {
        "IMROUTE_REDIS_URL": redis_url,
        "IMROUTE_REDIS_PREFIX": prefix,
        "IMROUTE_SECRET": SECRET,
        "IMROUTE_METRICS_PORT": str(ports[2]),
        **env,
    }
    with running(argv, base_env(**settings)) as proc:
        await asyncio.to_thread(read_until, proc, "ready", 60)
        yield ports


async def scrape(metrics_port: int, prefix: str) -> dict[str, float]:
    """The samples of a process's /metrics whose names start with `prefix`, by the
    rest of their names."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
    found = re.findall(rf"^{re.escape(prefix)}(\w+) (\S+)$", text, re.M)
    return {name: float(value) for name, value in found}
