"""Child processes started together and stopped together, each by its own PID.

`imroute dev`, the benchmarks and the process tests all start their children here:

    with Supervisor(env) as sup:
        api = sup.start("push-service", argv, stdout="lines")
        api.read_until("ready")              # or sup.wait_until(probe, timeout_s)
        ...
    # leaving the block: SIGTERM to each child (newest first), SIGKILL after the grace

Every child gets `die_with_parent` as its `preexec_fn`, so a supervisor killed by
SIGKILL leaves no orphans. PR_SET_PDEATHSIG fires when the *thread* that forked the
child ends: start children from a thread that outlives them (the main thread).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Literal, TypeVar

from router.processes.procs import die_with_parent, hold_stop_signals

__all__ = ["Child", "ChildExited", "Supervisor", "alive", "descendants"]

T = TypeVar("T")
Stdout = Literal["inherit", "null", "pipe", "lines"] | IO[bytes]
Stderr = Literal["inherit", "null", "stdout"] | IO[bytes]

GRACE_S = 10.0


class ChildExited(RuntimeError):
    """A child ended while its supervisor still needed it."""

    def __init__(self, child: Child) -> None:
        super().__init__(f"{child.name} exited with code {child.returncode}")
        self.child = child


class Child:
    """One child process. Started with stdout="lines", its output is read line by line
    on a daemon thread, for `read_until`; with "pipe", `stdout` is the raw pipe."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], *, whole_group: bool) -> None:
        self.name = name
        self.popen = popen
        self.whole_group = whole_group  # signals go to its process group (its own session)
        self.lines: queue.Queue[str | None] | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    @property
    def stdin(self) -> IO[bytes] | None:
        return self.popen.stdin

    @property
    def stdout(self) -> IO[bytes] | None:
        return self.popen.stdout if self.lines is None else None

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.popen.wait(timeout)

    def send_signal(self, sig: int) -> None:
        """Signal the child (or its group) by PID, unless it has already been reaped."""
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self.whole_group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)

    def read_until(self, marker: str, timeout: float = 30.0) -> list[str]:
        """Lines of output up to and including the first one containing `marker`;
        TimeoutError (naming what was seen) when it does not come in time or the output ends."""
        if self.lines is None:
            raise ValueError(f"{self.name} was not started with stdout='lines'")
        seen: list[str] = []
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                self.lines.put(None)  # the end stays visible to the next call
                break
            seen.append(line)
            if marker in line:
                return seen
        raise TimeoutError(f"never saw {marker!r}; output so far:\n" + "\n".join(seen))

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = GRACE_S) -> int:
        """`sig`, then SIGKILL if it is still there after `grace_s`; returns the exit code."""
        self.send_signal(sig)
        return self._reap(time.monotonic() + grace_s)

    def _reap(self, deadline: float) -> int:
        try:
            code = self.popen.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.send_signal(signal.SIGKILL)
            code = self.popen.wait()
        if self.whole_group:
            self._reap_group(deadline)
        # A pumped stdout is the pump's to close, at its end of file.
        for pipe in (self.popen.stdin, self.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        return code

    def _reap_group(self, deadline: float) -> None:
        """The leader is gone; members of its group that outlive the grace get SIGKILL."""
        while True:
            try:
                os.killpg(self.pid, 0)
            except (ProcessLookupError, PermissionError):
                return  # no member left
            if time.monotonic() >= deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                return
            time.sleep(0.05)

    def _pump(self) -> None:
        out, lines = self.popen.stdout, self.lines
        assert out is not None and lines is not None
        with out:
            for raw in out:
                lines.put(raw.decode(errors="replace").rstrip("\r\n"))
        lines.put(None)


class Supervisor:
    """The children of one run, in start order."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = env  # the default environment of every child (None: ours)
        self.children: list[Child] = []

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        stdin: Literal["null", "pipe"] = "null",
        stdout: Stdout = "inherit",
        stderr: Stderr = "inherit",
        new_session: bool = False,
        whole_group: bool = False,
        pass_fds: Sequence[int] = (),
        hold_stops: bool = False,
    ) -> Child:
        """Start `argv` as child `name`. new_session: a terminal's Ctrl-C reaches only us;
        whole_group (implies new_session): stop signals go to the child's process group;
        pass_fds: file descriptors the child inherits (a listening socket); hold_stops:
        it starts with SIGINT and SIGTERM blocked, and unblocks them once it can handle
        them (`router.processes.procs.hold_stop_signals`)."""
        popen = subprocess.Popen(
            list(argv),
            env=env if env is not None else self.env,
            cwd=cwd,
            stdin=subprocess.PIPE if stdin == "pipe" else subprocess.DEVNULL,
            stdout=_stdout(stdout),
            stderr=_stderr(stderr),
            start_new_session=new_session or whole_group,
            pass_fds=tuple(pass_fds),
            # A bare prctl, resolved beforehand (and a bare sigprocmask).
            preexec_fn=_holding if hold_stops else die_with_parent,  # noqa: PLW1509
        )
        child = Child(name, popen, whole_group=whole_group)
        if stdout == "lines":
            child.lines = queue.Queue()
            threading.Thread(target=child._pump, name=f"lines-{name}", daemon=True).start()
        self.children.append(child)
        return child

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def exited(self) -> list[Child]:
        """The children that have ended, in start order."""
        return [c for c in self.children if c.poll() is not None]

    def check(self) -> None:
        """ChildExited for the first child that has ended."""
        for child in self.exited():
            raise ChildExited(child)

    def forget(self, child: Child) -> None:
        """No longer this supervisor's to watch or stop."""
        self.children.remove(child)

    def wait_until(
        self,
        probe: Callable[[], T | None],
        timeout_s: float,
        *,
        interval_s: float = 0.2,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> T | None:
        """`probe()` until it returns something, checking the children between tries
        (ChildExited); None when `timeout_s` passed or `cancelled()` said so."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not cancelled():
            self.check()
            found = probe()
            if found is not None:
                return found
            time.sleep(interval_s)
        return None

    def stop(self, child: Child, sig: int = signal.SIGTERM, grace_s: float = GRACE_S) -> int:
        """Stop one child (see Child.stop) and forget it."""
        code = child.stop(sig, grace_s)
        self.forget(child)
        return code

    def stop_all(self, sig: int = signal.SIGTERM, grace_s: float = GRACE_S) -> None:
        """`sig` to every child at once (newest first), then wait for them all within one
        `grace_s`, SIGKILL for those still there; forget them."""
        children = list(reversed(self.children))
        for child in children:
            child.send_signal(sig)
        deadline = time.monotonic() + grace_s
        for child in children:
            child._reap(deadline)
        self.children.clear()

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def _holding() -> None:
    die_with_parent()
    hold_stop_signals()


def _stdout(mode: Stdout) -> int | IO[bytes] | None:
    if not isinstance(mode, str):
        return mode
    return {"inherit": None, "null": subprocess.DEVNULL}.get(mode, subprocess.PIPE)


def _stderr(mode: Stderr) -> int | IO[bytes] | None:
    if not isinstance(mode, str):
        return mode
    return {"inherit": None, "null": subprocess.DEVNULL, "stdout": subprocess.STDOUT}[mode]


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (not gone, not a zombie)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def descendants(pid: int) -> set[int]:
    """Every live descendant of `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(entry)) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found
