"""The lines every report shares (conditions) and the facts behind them."""

from __future__ import annotations

import contextlib
import cProfile
import io
import json
import math
import pstats
import subprocess
import time
from collections.abc import Iterable, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import redis

from bench.harness.stats import machine_info

__all__ = [
    "MIB",
    "ROOT",
    "code_version",
    "conditions",
    "git_commit",
    "machine_lines",
    "mark",
    "mib",
    "ms",
    "print_json",
    "profile_summary",
    "redis_facts",
    "versions",
]

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]  # the checkout the benchmarks belong to
PRODUCT_DIRS = ("push_service", "router", "shared", "socket_gateway")


def conditions(loop: str) -> dict[str, str]:
    """Machine facts, the date and the client-side event loop of a run."""
    return machine_info() | {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "loop": loop}


def machine_lines(cond: Mapping[str, str]) -> list[str]:
    """The date and machine lines at the head of a report's conditions."""
    return [
        f"  date        {cond['date']}",
        f"  machine     nproc={cond['nproc']}  cpu={cond['cpu']}  ram={cond['ram']}"
        f"  kernel={cond['kernel']}",
    ]


def versions(names: Iterable[str] = ("redis", "hiredis", "protobuf", "uvloop")) -> dict[str, str]:
    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def redis_facts(url: str) -> dict[str, str]:
    """The server's version and used memory ("unknown" when it does not say)."""
    facts = {"redis_version": "unknown", "redis_used_mib": "unknown"}
    with contextlib.suppress(redis.RedisError, OSError, KeyError, ValueError):
        client = redis.Redis.from_url(url, socket_timeout=5)
        try:
            facts["redis_version"] = str(client.info("server")["redis_version"])
            facts["redis_used_mib"] = f"{int(client.info('memory')['used_memory']) / MIB:.0f}"
        finally:
            client.close()
    return facts


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
    ).stdout.strip()


def git_commit(root: Path = ROOT) -> str:
    """The short commit of a checkout; "unknown" when it is none."""
    try:
        return _git(root, "rev-parse", "--short", "HEAD") or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def code_version() -> str:
    """Which product code the children import: its folder, and its commit when it is a
    git checkout (other sessions may commit while a run goes on: measure a snapshot)."""
    import router

    root = Path(router.__file__).resolve().parent.parent
    try:
        head = _git(root, "rev-parse", "--short", "HEAD")
        dirty = _git(root, "status", "--porcelain", "--", *PRODUCT_DIRS)
    except (OSError, subprocess.SubprocessError):
        return f"{root} (not a git checkout)"
    return f"{root} at {head}" + (" with uncommitted changes" if dirty else "")


def profile_summary(profiler: cProfile.Profile, top: int = 25) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats(pstats.SortKey.TIME).print_stats(top)
    stats.sort_stats(pstats.SortKey.CUMULATIVE).print_stats(top)
    return out.getvalue()


def print_json(wanted: bool, doc: object) -> None:
    """With --json: the run's figures as one JSON document after the report."""
    if wanted:
        print(json.dumps(doc, default=str))


def mib(kib: int) -> float:
    return kib / 1024


def mark(ok: bool) -> str:
    return "met" if ok else "MISSED"


def ms(seconds: float) -> str:
    """Seconds as milliseconds: one decimal under a second, none above; "-" for nan."""
    if math.isnan(seconds):
        return "-"
    return f"{seconds * 1000:,.1f}" if seconds < 1 else f"{seconds * 1000:,.0f}"
