"""Test-only helpers for running imroute as real subprocesses, on router.processes.supervisor."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from pathlib import Path

import httpx

from router.processes.ports import free_port
from router.processes.supervisor import Child, Supervisor, descendants
from tests.conftest import ADMIN_KEY, API_KEY, SECRET

__all__ = [
    "BIN",
    "Proc",
    "announced_ws_url",
    "base_env",
    "dev_started",
    "directory_url",
    "gateway_env",
    "gateway_process",
    "imroute",
    "imroute_at",
    "pid_of",
    "push_services",
    "read_until",
    "running",
    "scrape",
    "service_env",
    "ws_url_of",
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


def announced_ws_url(proc: Proc, timeout: float = 30.0) -> str:
    """The WebSocket URL a gateway process announces once it says it is ready."""
    line = read_until(proc, "ready", timeout)[-1]
    found = re.search(r"ws=(\S+)", line)
    assert found, line
    return found.group(1)


async def ws_url_of(proc: Proc) -> str:
    """`announced_ws_url`, read in a thread: the test's loop, its in-process servers and
    heartbeats, goes on meanwhile."""
    return await asyncio.to_thread(announced_ws_url, proc)


def imroute(
    *args: str, env: dict[str, str], timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """The `imroute` CLI run to its end with `env`, its output captured as text (its exit
    status is the caller's to check)."""
    return subprocess.run(
        [str(BIN / "imroute"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


async def imroute_at(
    port: int, *args: str, key: str | None = API_KEY, admin: str | None = ADMIN_KEY
) -> tuple[int, str, str]:
    """`imroute ARGS...` as a process against the push service on `port`, its keys in its
    environment: its exit code, standard output and error."""
    environ = base_env(IMROUTE_API_URL=f"http://127.0.0.1:{port}")
    if key is not None:
        environ["IMROUTE_API_KEY"] = key
    if admin is not None:
        environ["IMROUTE_ADMIN_API_KEY"] = admin
    done = await asyncio.to_thread(imroute, *args, env=environ)  # the loop serves meanwhile
    return done.returncode, done.stdout, done.stderr


def dev_started(dev: Proc) -> tuple[str, str, str, str]:
    """`imroute dev`'s output up to the end of its banner, once it has started everything:
    the banner, and the API key, admin key and secret it printed there."""
    banner = "\n".join(read_until(dev, "Ctrl-C stops everything", timeout=60))
    key = re.search(r"API key:\s+(\S+)", banner)
    admin = re.search(r"admin key:\s+(\S+)", banner)
    secret = re.search(r"secret:\s+(\S+)", banner)
    assert key and admin and secret, banner
    return banner, key.group(1), admin.group(1), secret.group(1)


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


def gateway_env(redis_url: str, prefix: str, **extra: str) -> dict[str, str]:
    """`base_env` for a gateway: its Redis, its key prefix and the tests' secret, plus `extra`."""
    return base_env(
        IMROUTE_REDIS_URL=redis_url, IMROUTE_REDIS_PREFIX=prefix, IMROUTE_SECRET=SECRET, **extra
    )


def directory_url(folder: Path) -> str:
    """The SQLite user directory of a push service started in `folder`."""
    return f"sqlite+aiosqlite:///{folder}/users.db"


def service_env(redis_url: str, prefix: str, folder: Path, **extra: str) -> dict[str, str]:
    """`base_env` for a push service: its Redis, its key prefix, the tests' API key and a
    user directory in `folder`, plus `extra` (no secret unless `extra` sets one)."""
    return base_env(
        IMROUTE_REDIS_URL=redis_url,
        IMROUTE_REDIS_PREFIX=prefix,
        IMROUTE_API_KEY=API_KEY,
        IMROUTE_DB_URL=directory_url(folder),
        **extra,
    )


@asynccontextmanager
async def gateway_process(
    redis_url: str, prefix: str, gid: str = "gwp", **env: str
) -> AsyncIterator[list[int]]:
    """A real gateway (`imroute gateway`, on uvloop) with `env` (IMROUTE_*) set, once it
    says it is ready: its WebSocket, gRPC and metrics ports."""
    ports = [free_port(), free_port(), free_port()]
    argv = [str(BIN / "imroute"), "gateway", "--id", gid, "--group", "g1",
            "--ws-port", str(ports[0]), "--grpc-port", str(ports[1])]  # fmt: skip
    settings = gateway_env(redis_url, prefix, IMROUTE_METRICS_PORT=str(ports[2]), **env)
    with running(argv, settings) as proc:
        await asyncio.to_thread(read_until, proc, "ready", 60)
        yield ports


async def scrape(metrics_port: int, prefix: str) -> dict[str, float]:
    """The samples of a process's /metrics whose names start with `prefix`, by the
    rest of their names."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
    found = re.findall(rf"^{re.escape(prefix)}(\w+) (\S+)$", text, re.M)
    return {name: float(value) for name, value in found}


def pid_of(parent: int, gateway_id: str) -> int:
    """The PID of the child of `parent` that runs gateway `gateway_id`."""
    for pid in descendants(parent):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"socket_gateway" in argv and gateway_id.encode() in argv:
            return pid
    raise AssertionError(f"no process runs {gateway_id}")
