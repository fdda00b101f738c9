"""Test-only helpers for running imroute as real subprocesses, on router.devtools.supervisor."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from pathlib import Path

from router.devtools.supervisor import Child, Supervisor

__all__ = ["BIN", "Proc", "base_env", "push_services", "read_until", "running"]

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
