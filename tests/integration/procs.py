"""Helpers for tests that run imroute as real subprocesses."""

from __future__ import annotations

import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port_block(offsets: list[int]) -> int:
    """A base port such that base+offset is free for every offset."""
    for _ in range(200):
        base = random.randint(20000, 40000)
        if all(_free(base + o) for o in offsets):
            return base
    raise RuntimeError("no free port block")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def descendants(pid: int) -> set[int]:
    """Every live descendant of `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class Proc(subprocess.Popen[str]):
    """A subprocess whose stdout lines are collected by a thread, for read_until."""

    lines: queue.Queue[str | None]


@contextmanager
def running(argv: list[str], env: dict[str, str]) -> Iterator[Proc]:
    """A subprocess with its output read line by line, always reaped (by PID) on exit."""
    proc = Proc(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    proc.lines = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            proc.lines.put(line.rstrip("\n"))
        proc.lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def read_until(proc: Proc, marker: str, timeout: float = 30.0) -> list[str]:
    """Lines of output up to and including the first one containing `marker`."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = proc.lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if marker in line:
            return seen
    raise AssertionError(f"never saw {marker!r}; output so far:\n" + "\n".join(seen))


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMROUTE_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env
