"""Child scripts and helpers for the supervisor's tests (real processes, `python -c`).

Every process of those tests is started by the test, directly or through a child, and is
only ever signalled by its PID. The `strays` fixture SIGKILLs (by PID) the grandchildren
a test expects to outlive their parent, so that no failing test leaves a sleeper behind.
"""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

from router.processes.supervisor import Child, Supervisor, alive

REPO = Path(__file__).resolve().parents[2]
GRACE_S = 0.5  # a short grace for the children that ignore SIGTERM

SLEEPER = "import time; time.sleep(30)"

READY_SLEEPER = """
import time
print("ready", flush=True)
time.sleep(30)
"""

IGNORES_SIGTERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(30)
"""

EXITS_3_ON_SIGTERM = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(3))
print("ready", flush=True)
time.sleep(30)
"""

# Keeps SIGTERM blocked, so that it stays pending (visible in /proc/<pid>/status) until the
# SIGKILL. Reads the PIDs of the children started after it from stdin; once its own SIGTERM
# is pending it prints which of those already have theirs pending too.
BLOCKS_SIGTERM = """
import signal, sys, time
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
newer = sys.stdin.readline().split()

def term_pending(pid):
    bit = 1 << (signal.SIGTERM - 1)
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f)
    except OSError:
        return False
    return any(int(fields[key], 16) & bit for key in ("SigPnd", "ShdPnd"))

print("ready", flush=True)
while not term_pending("self"):
    time.sleep(0.01)
print("SIGTERM; pending in the newer ones:", *[p for p in newer if term_pending(p)], flush=True)
time.sleep(30)
"""

# argv[1]: "default" or "ignore-sigterm". Prints its PID on the inherited stdout.
GRANDCHILD = """
import os, signal, sys, time
if sys.argv[1] == "ignore-sigterm":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(f"grandchild pid={os.getpid()}", flush=True)
time.sleep(30)
"""

# Starts GRANDCHILD (argv[1], with argv[2]) with plain subprocess, then sleeps.
SPAWNS_GRANDCHILD = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
time.sleep(30)
"""

# A supervisor of its own: starts a grandchild that writes the signal it got to argv[1],
# waits until it is ready, prints its PID and sleeps (to be SIGKILLed by the test).
MIDDLE_SUPERVISOR = """
import sys, time
from router.processes.supervisor import Supervisor

GRANDCHILD = '''
import signal, sys, time
from pathlib import Path

def on_term(signum, frame):
    Path(sys.argv[1]).write_text("SIGTERM")
    sys.exit(0)

signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(30)
'''
sup = Supervisor()
argv = [sys.executable, "-c", GRANDCHILD, sys.argv[1]]
grandchild = sup.start("grandchild", argv, stdout="lines")
grandchild.read_until("ready", 10)
print(f"grandchild pid={grandchild.pid}", flush=True)
time.sleep(30)
"""

LISTENS_LATER = """
import socket, sys, time
time.sleep(0.3)
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
time.sleep(30)
"""


def py(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code), *args]


def gone_within(pid: int, timeout_s: float) -> bool:
    """Whether `pid` is gone (or a zombie) within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def pid_from(line: str) -> int:
    return int(line.rsplit("pid=", 1)[1])


def with_grandchild(
    sup: Supervisor, strays: list[int], name: str, on_sigterm: str, **start: bool
) -> tuple[Child, int]:
    """A child (`sup.start` options: `start`) that has started a grandchild, which does
    `on_sigterm` ("default" or "ignore-sigterm"); the grandchild's PID is in `strays`."""
    argv = py(SPAWNS_GRANDCHILD, textwrap.dedent(GRANDCHILD), on_sigterm)
    child = sup.start(name, argv, stdout="lines", **start)
    grandchild = pid_from(child.read_until("grandchild pid=", 5)[-1])
    strays.append(grandchild)
    return child, grandchild
