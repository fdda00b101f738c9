"""A bench's worker processes: the parent spawns one with a JSON spec on its command line
(`python -m bench.<name> --worker '{...}'`) and talks to it over bench.harness.link; the
worker runs its coroutine on a loop of its own (uvloop when installed)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Coroutine
from typing import Any

from bench.harness.clients import indices_of
from bench.harness.stack import Harness, bench_argv, raise_nofile, run_loop
from router.processes.supervisor import Child

__all__ = ["add_worker_flag", "serve_worker", "spawn_worker"]

Spec = dict[str, Any]


def add_worker_flag(p: argparse.ArgumentParser, flag: str = "--worker") -> None:
    """The hidden flag that makes the bench a worker process; it takes the spec's JSON."""
    p.add_argument(flag, help=argparse.SUPPRESS)


def spawn_worker(
    h: Harness, module: str, spec: Spec, name: str = "clients", flag: str = "--worker"
) -> Child:
    """Start `module` as the child `name` with `flag` and `spec`, JSON lines on its pipes."""
    return h.stack.spawn(name, bench_argv(module, flag, json.dumps(spec)), pipes=True)


def serve_worker(
    work: Callable[[Spec], Coroutine[Any, Any, None]], spec_json: str, per_client: int = 1
) -> int:
    """The worker's side: room for `per_client` file descriptors for each of the spec's
    clients (its "indices"), then `work(spec)` until it returns; the exit code."""
    spec = json.loads(spec_json)
    raise_nofile(per_client * len(indices_of(spec)) + 1024)
    run_loop(work(spec))
    return 0
