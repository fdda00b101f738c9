"""Figures (the one percentile helper) and readings of this machine: CPU, memory, facts."""

from __future__ import annotations

import contextlib
import math
import os
import platform
import resource
import statistics
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from router.processes.supervisor import descendants

__all__ = [
    "CpuMeter",
    "RssSampler",
    "all_cpu",
    "best_of",
    "busy_seconds",
    "cpu_seconds",
    "cpu_snapshot",
    "machine_info",
    "others_cpu",
    "percentile",
    "process_cpu_s",
    "reset_peak_rss",
    "ru_maxrss_kib",
    "spread",
    "steal_seconds",
    "vm_kib",
]

CLK_TCK = os.sysconf("SC_CLK_TCK")


def percentile(sorted_xs: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending sequence; nan when empty."""
    if not sorted_xs:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(sorted_xs)))
    return sorted_xs[min(rank, len(sorted_xs)) - 1]


def spread(xs: Iterable[float], *, count: bool = False) -> dict[str, float]:
    """p50, p90, p99 and max of `xs` (and n, with count=True)."""
    ordered = sorted(xs)
    out = {f"p{p}": percentile(ordered, p) for p in (50, 90, 99)}
    out["max"] = ordered[-1] if ordered else math.nan
    if count:
        out["n"] = float(len(ordered))
    return out


def best_of(xs: Iterable[float], best: Callable[[list[float]], float] = min) -> dict[str, float]:
    """Median, best and worst of the figures that are not nan (best: min or max)."""
    clean = [x for x in xs if not math.isnan(x)]
    if not clean:
        return {"median": math.nan, "best": math.nan, "worst": math.nan}
    worst = min if best is max else max
    return {"median": statistics.median(clean), "best": best(clean), "worst": worst(clean)}


# --------------------------------------------------------------------------- CPU


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process, from /proc/<pid>/stat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def all_cpu() -> dict[int, float]:
    """CPU seconds of every process on the machine, by PID."""
    out: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (s := cpu_seconds(int(entry))) is not None:
            out[int(entry)] = s
    return out


def others_cpu(before: dict[int, float], after: dict[int, float], mine: set[int]) -> float:
    """CPU seconds that processes not in `mine` used between two `all_cpu()` snapshots.

    Other sessions' work on a shared machine shows up here; a busy neighbour makes
    every figure of the run worse. (Processes that exited in between are missed.)
    """
    ours = set(mine).union(*(descendants(pid) for pid in mine if pid != os.getpid()))
    return sum(t - before.get(pid, 0.0) for pid, t in after.items() if pid not in ours)


def cpu_snapshot(pids: dict[str, int]) -> tuple[dict[str, float], dict[int, float]]:
    """CPU seconds of the named processes, each with its descendants (a push service's
    workers, IMROUTE_WORKERS; not ours, whose descendants are the stack), and of every
    process."""
    everyone = all_cpu()
    me = os.getpid()
    named = {
        name: sum(everyone.get(p, 0.0) for p in {pid, *(descendants(pid) if pid != me else ())})
        for name, pid in pids.items()
        if pid in everyone
    }
    return named, everyone


class CpuMeter:
    """CPU seconds between `start()` and `stop()`: this process, a local redis-server
    (None when it is not local), and every other process of the machine."""

    def __init__(self, redis_pid: int | None) -> None:
        self._redis_pid = redis_pid
        self._mine = {os.getpid()} | ({redis_pid} if redis_pid else set())
        self.self_s = self.others_s = 0.0
        self.redis_s: float | None = None

    def start(self) -> CpuMeter:
        self._self, self._everyone = process_cpu_s(), all_cpu()
        self._redis = cpu_seconds(self._redis_pid) if self._redis_pid else None
        return self

    def stop(self) -> CpuMeter:
        self.self_s = process_cpu_s() - self._self
        redis_after = cpu_seconds(self._redis_pid) if self._redis_pid else None
        if self._redis is not None and redis_after is not None:
            self.redis_s = redis_after - self._redis
        self.others_s = others_cpu(self._everyone, all_cpu(), self._mine)
        return self


def process_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _cpu_line() -> list[int]:
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


def busy_seconds() -> float:
    """CPU time the whole machine spent busy so far, all CPUs (minus idle and iowait)."""
    ticks = _cpu_line()
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / CLK_TCK


def steal_seconds() -> float:
    """CPU time the hypervisor took from this VM so far, all CPUs (/proc/stat)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return _cpu_line()[7] / CLK_TCK
    return 0.0


# --------------------------------------------------------------------------- memory


def vm_kib(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(rest.split()[0])
    return out


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False when not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def ru_maxrss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


class RssSampler:
    """Samples VmRSS every `interval_s` on a thread: a check of VmHWM that needs no reset."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self.peak_kib = 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_kib = max(self.peak_kib, vm_kib()["VmRSS"])
            self._stop.wait(self._interval)

    def __enter__(self) -> RssSampler:
        self.peak_kib = vm_kib()["VmRSS"]
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_kib = max(self.peak_kib, vm_kib()["VmRSS"])


# --------------------------------------------------------------------------- machine


def machine_info() -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram = "unknown"
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
                break
    return {
        "nproc": str(len(os.sched_getaffinity(0))),
        "cpu": cpu,
        "ram": ram,
        "kernel": platform.release(),
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
    }
