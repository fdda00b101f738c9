"""router.devtools.supervisor with real child processes (`python -c` scripts, no mocks).

Every process here is started by the test, directly or through a child, and is only ever
signalled by its PID. The `strays` fixture SIGKILLs (by PID) the grandchildren a test expects
to outlive their parent, so that no failing test leaves a sleeper behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.devtools.ports import free_port, port_free
from router.devtools.supervisor import Child, ChildExited, Supervisor, alive, descendants

pytestmark = pytest.mark.integration

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
from router.devtools.supervisor import Supervisor

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


@pytest.fixture
def sup() -> Iterator[Supervisor]:
    supervisor = Supervisor()
    try:
        yield supervisor
    finally:
        supervisor.stop_all(grace_s=1.0)


@pytest.fixture
def strays() -> Iterator[list[int]]:
    """PIDs of grandchildren a test started; SIGKILLed by PID at the end if still alive."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# read_until


def test_read_until_returns_the_lines_up_to_and_including_the_marker(sup: Supervisor) -> None:
    code = """
    import sys, time
    print("booting", flush=True)
    print("a warning", file=sys.stderr, flush=True)
    sys.stdout.write("crlf line\\r\\n")
    print("listening: ready", flush=True)
    print("after", flush=True)
    time.sleep(30)
    """
    child = sup.start("talker", py(code), stdout="lines", stderr="stdout")
    assert child.stdout is None  # the pump owns the pipe
    assert child.read_until("ready", 5) == ["booting", "a warning", "crlf line", "listening: ready"]
    # The next read goes on from the line after the marker.
    assert child.read_until("after", 5) == ["after"]


def test_read_until_raises_timeout_naming_the_output_when_the_child_exits_first(
    sup: Supervisor,
) -> None:
    code = """
    import sys
    print("one", flush=True)
    print("two", flush=True)
    sys.exit(3)
    """
    child = sup.start("quitter", py(code), stdout="lines")
    started = time.monotonic()
    with pytest.raises(TimeoutError) as raised:
        child.read_until("ready", 10)
    assert time.monotonic() - started < 2  # at the end of the output, not after the 10 s
    message = str(raised.value)
    assert "never saw 'ready'" in message
    assert "one\ntwo" in message
    assert child.wait(2) == 3


def test_read_until_raises_timeout_naming_the_output_on_timeout(sup: Supervisor) -> None:
    code = """
    import time
    print("starting", flush=True)
    time.sleep(30)
    """
    child = sup.start("slow", py(code), stdout="lines")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="never saw 'ready'") as raised:
        child.read_until("ready", 0.5)
    assert 0.45 <= time.monotonic() - started < 1.5
    assert "starting" in str(raised.value)
    assert child.poll() is None  # a timeout does not stop the child


def test_read_until_needs_stdout_lines(sup: Supervisor) -> None:
    child = sup.start("raw", py(READY_SLEEPER), stdout="pipe")
    assert child.stdout is not None  # "pipe": the raw pipe is the caller's
    assert child.stdout.readline() == b"ready\n"
    with pytest.raises(ValueError, match="raw was not started with stdout='lines'"):
        child.read_until("ready", 1)


def test_read_until_after_the_output_ended_raises_at_once(sup: Supervisor) -> None:
    child = sup.start("quitter", py("print('bye', flush=True)"), stdout="lines")
    with pytest.raises(TimeoutError):
        child.read_until("ready", 5)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        child.read_until("ready", 1.5)
    assert time.monotonic() - started < 0.5


# stop


@pytest.mark.parametrize(
    ("code", "sig", "expected"),
    [
        (READY_SLEEPER, signal.SIGTERM, -signal.SIGTERM),
        (EXITS_3_ON_SIGTERM, signal.SIGTERM, 3),
        (READY_SLEEPER, signal.SIGUSR1, -signal.SIGUSR1),
    ],
    ids=["killed-by-sigterm", "exits-3-on-sigterm", "sig-sigusr1"],
)
def test_stop_sends_the_signal_and_returns_the_exit_code(
    sup: Supervisor, code: str, sig: int, expected: int
) -> None:
    child = sup.start("server", py(code), stdin="pipe", stdout="lines")
    child.read_until("ready", 5)
    started = time.monotonic()
    assert sup.stop(child, sig, grace_s=5) == expected
    assert time.monotonic() - started < 1  # no waiting for the grace
    assert child.returncode == expected
    assert child not in sup.children  # stopped and forgotten
    assert child.stdin is not None
    assert child.stdin.closed


def test_stop_sigkills_a_child_that_ignores_sigterm_after_the_grace(sup: Supervisor) -> None:
    child = sup.start("stubborn", py(IGNORES_SIGTERM), stdout="lines")
    child.read_until("ready", 5)
    started = time.monotonic()
    assert sup.stop(child, grace_s=GRACE_S) == -signal.SIGKILL
    assert GRACE_S <= time.monotonic() - started < GRACE_S + 1
    assert not alive(child.pid)


def test_stop_of_a_child_that_already_exited_returns_its_code(sup: Supervisor) -> None:
    child = sup.start("done", py("raise SystemExit(7)"))
    assert child.wait(2) == 7
    assert sup.stop(child, grace_s=5) == 7
    assert sup.children == []


# stop_all


def test_stop_all_signals_every_child_newest_first_with_one_grace(sup: Supervisor) -> None:
    names = ["oldest", "middle", "newest"]
    children = [sup.start(name, py(BLOCKS_SIGTERM), stdin="pipe", stdout="lines") for name in names]
    for i, child in enumerate(children):
        assert child.stdin is not None
        child.stdin.write((" ".join(str(c.pid) for c in children[i + 1 :]) + "\n").encode())
        child.stdin.flush()
        child.read_until("ready", 5)

    reports: dict[str, str] = {}
    ended: dict[str, float] = {}

    def watch(child: Child) -> None:
        reports[child.name] = child.read_until("SIGTERM;", 5)[-1]
        with contextlib.suppress(TimeoutError):  # raised at the end of its output: its death
            child.read_until("never printed", 5)
        ended[child.name] = time.monotonic()

    watchers = [threading.Thread(target=watch, args=(c,), daemon=True) for c in children]
    for watcher in watchers:
        watcher.start()
    started = time.monotonic()
    sup.stop_all(grace_s=GRACE_S)
    elapsed = time.monotonic() - started
    for watcher in watchers:
        watcher.join(5)

    # SIGTERM reached every child before any SIGKILL; when each noticed its own, the ones
    # started after it already had theirs (the signals go out newest first; the order in
    # which the children *react* is the scheduler's, so it is not what is checked).
    for i, child in enumerate(children):
        pending = reports[child.name].split(":", 1)[1].split()
        assert pending == [str(c.pid) for c in children[i + 1 :]], reports
    # One grace for all (one each would take 3 * GRACE_S), then SIGKILL, newest first.
    assert GRACE_S <= elapsed < GRACE_S + 0.6
    assert sorted(ended, key=ended.__getitem__) == ["newest", "middle", "oldest"]
    assert [c.returncode for c in children] == [-signal.SIGKILL] * 3
    assert sup.children == []


def test_stop_all_leaves_a_forgotten_child_alone(sup: Supervisor) -> None:
    kept = sup.start("kept", py(SLEEPER))
    forgotten = sup.start("forgotten", py(SLEEPER))
    sup.forget(forgotten)
    try:
        sup.stop_all(grace_s=5)
        assert kept.returncode == -signal.SIGTERM
        assert forgotten.poll() is None
    finally:
        assert forgotten.stop(grace_s=5) == -signal.SIGTERM


# whole_group


@pytest.mark.parametrize("how", ["stop", "stop_all"])
def test_whole_group_also_stops_the_childs_children(
    sup: Supervisor, strays: list[int], how: str
) -> None:
    argv = py(SPAWNS_GRANDCHILD, textwrap.dedent(GRANDCHILD), "default")
    child = sup.start("group", argv, stdout="lines", whole_group=True)
    grandchild = pid_from(child.read_until("grandchild pid=", 5)[-1])
    strays.append(grandchild)
    assert os.getsid(child.pid) == child.pid  # whole_group implies new_session
    assert os.getpgid(grandchild) == child.pid
    assert descendants(child.pid) == {grandchild}

    if how == "stop":
        assert sup.stop(child, grace_s=5) == -signal.SIGTERM
    else:
        sup.stop_all(grace_s=5)
        assert child.returncode == -signal.SIGTERM
    assert gone_within(grandchild, 1)


@pytest.mark.parametrize("new_session", [False, True])
def test_without_whole_group_only_the_child_is_signalled(
    sup: Supervisor, strays: list[int], new_session: bool
) -> None:
    argv = py(SPAWNS_GRANDCHILD, textwrap.dedent(GRANDCHILD), "default")
    child = sup.start("parent", argv, stdout="lines", new_session=new_session)
    grandchild = pid_from(child.read_until("grandchild pid=", 5)[-1])
    strays.append(grandchild)
    assert (os.getsid(child.pid) == child.pid) is new_session

    assert sup.stop(child, grace_s=5) == -signal.SIGTERM
    time.sleep(0.2)
    assert alive(grandchild)  # signals went to the child's PID only


def test_whole_group_sigkills_group_members_that_outlive_the_leader(
    sup: Supervisor, strays: list[int]
) -> None:
    argv = py(SPAWNS_GRANDCHILD, textwrap.dedent(GRANDCHILD), "ignore-sigterm")
    child = sup.start("group", argv, stdout="lines", whole_group=True)
    grandchild = pid_from(child.read_until("grandchild pid=", 5)[-1])
    strays.append(grandchild)
    assert os.getpgid(grandchild) == child.pid

    assert sup.stop(child, grace_s=GRACE_S) == -signal.SIGTERM
    assert gone_within(grandchild, GRACE_S + 1)


# die_with_parent


def test_the_children_of_a_sigkilled_supervisor_get_sigterm(
    sup: Supervisor, strays: list[int], tmp_path: Path
) -> None:
    got = tmp_path / "grandchild-got"
    middle = sup.start(
        "middle", py(MIDDLE_SUPERVISOR, str(got)), cwd=REPO, stdout="lines", stderr="stdout"
    )
    grandchild = pid_from(middle.read_until("grandchild pid=", 10)[-1])
    strays.append(grandchild)
    assert descendants(middle.pid) == {grandchild}

    os.kill(middle.pid, signal.SIGKILL)
    assert middle.wait(2) == -signal.SIGKILL
    assert gone_within(grandchild, 3)
    assert got.read_text() == "SIGTERM"


def test_a_child_started_from_a_thread_gets_sigterm_when_that_thread_ends(
    sup: Supervisor,
) -> None:
    # The documented caveat of PR_SET_PDEATHSIG: it fires when the forking *thread* ends.
    started: list[Child] = []
    thread = threading.Thread(target=lambda: started.append(sup.start("s", py(SLEEPER))))
    thread.start()
    thread.join()
    assert started[0].wait(2) == -signal.SIGTERM


# wait_until


def test_wait_until_returns_the_first_value_that_is_not_none(sup: Supervisor) -> None:
    sup.start("sleeper", py(SLEEPER))
    answers: list[int | None] = [None, None, 0, 1]
    calls: list[int] = []

    def probe() -> int | None:
        calls.append(1)
        return answers[len(calls) - 1]

    # "Something" is anything but None: a falsy 0 ends the wait (callers write `x or None`).
    assert sup.wait_until(probe, 5, interval_s=0.01) == 0
    assert len(calls) == 3


def test_wait_until_probes_a_real_port_until_a_child_listens(sup: Supervisor) -> None:
    port = free_port()
    sup.start("server", py(LISTENS_LATER, str(port)))
    started = time.monotonic()
    found = sup.wait_until(lambda: None if port_free(port) else port, 5, interval_s=0.05)
    assert found == port
    assert time.monotonic() - started < 2


def test_wait_until_returns_none_on_timeout_or_when_cancelled(sup: Supervisor) -> None:
    sup.start("sleeper", py(SLEEPER))
    started = time.monotonic()
    assert sup.wait_until(lambda: None, 0.4, interval_s=0.05) is None
    assert 0.4 <= time.monotonic() - started < 1.4

    calls: list[int] = []
    started = time.monotonic()
    result = sup.wait_until(lambda: calls.append(1), 5, cancelled=lambda: True)
    assert result is None
    assert calls == []
    assert time.monotonic() - started < 0.5


def test_wait_until_raises_child_exited_when_a_child_dies(sup: Supervisor) -> None:
    sup.start("sleeper", py(SLEEPER))
    crasher = sup.start("crasher", py("import time; time.sleep(0.3); raise SystemExit(4)"))
    calls: list[int] = []

    def probe() -> None:
        calls.append(1)

    started = time.monotonic()
    with pytest.raises(ChildExited) as raised:
        sup.wait_until(probe, 10, interval_s=0.05)
    assert time.monotonic() - started < 2
    assert raised.value.child is crasher
    assert str(raised.value) == "crasher exited with code 4"
    assert calls  # it probed while the child was up
    assert sup.exited() == [crasher]

    # The children are checked before every probe: an ended child fails the wait at once.
    calls.clear()
    with pytest.raises(ChildExited):
        sup.wait_until(probe, 10)
    assert calls == []


# the context manager


class Boom(Exception):
    pass


def leave_the_block(sup: Supervisor, children: list[Child], *, body_raises: bool) -> None:
    with sup:
        children += [sup.start(name, py(SLEEPER)) for name in ("a", "b", "c")]
        assert all(alive(c.pid) for c in children)
        if body_raises:
            raise Boom


@pytest.mark.parametrize("body_raises", [False, True])
def test_leaving_the_block_stops_every_child(body_raises: bool) -> None:
    sup, children = Supervisor(), list[Child]()
    started = time.monotonic()
    if body_raises:
        with pytest.raises(Boom):  # stopped, and the exception goes on
            leave_the_block(sup, children, body_raises=True)
    else:
        leave_the_block(sup, children, body_raises=False)
    assert sup.children == []
    assert [c.returncode for c in children] == [-signal.SIGTERM] * 3
    assert not any(alive(c.pid) for c in children)
    assert time.monotonic() - started < 2
