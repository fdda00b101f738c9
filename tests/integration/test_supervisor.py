"""router.processes.supervisor with real child processes (`python -c` scripts, no mocks):
reading output, stop, stop_all and the context manager (how they treat their
processes: tests/integration/supervised.py).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import signal
import threading
import time

import pytest

from router.processes.supervisor import Child, Supervisor, alive
from tests.integration.supervised import (
    BLOCKS_SIGTERM,
    EXITS_3_ON_SIGTERM,
    GRACE_S,
    IGNORES_SIGTERM,
    READY_SLEEPER,
    SLEEPER,
    py,
)

pytestmark = pytest.mark.integration


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


def test_a_stop_sent_while_a_child_starts_is_held_until_it_can_handle_it(
    sup: Supervisor,
) -> None:
    """A replacement push-service worker sent SIGINT during its imports ran on until the
    grace's SIGKILL when the KeyboardInterrupt landed where Python drops it (a
    finalizer, a callback): this child drops it as such a place would. Held, the SIGINT
    waits for the handler the child then installs."""
    code = """
    import signal, sys, time
    from router.processes.procs import take_stop_signals
    print("starting", flush=True)
    try:
        time.sleep(1.0)  # the start: imports, the app's set-up
    except KeyboardInterrupt:
        print("dropped", flush=True)  # as a finalizer's exception is
    signal.signal(signal.SIGINT, lambda *_: (print("stopping", flush=True), sys.exit(0)))
    take_stop_signals()
    print("serving", flush=True)
    time.sleep(30)
    """
    child = sup.start("worker", py(code), stdout="lines", stderr="stdout", hold_stops=True)
    child.read_until("starting", 10)
    child.send_signal(signal.SIGINT)
    assert child.read_until("stopping", 10) == ["stopping"]  # neither dropped nor serving
    assert child.wait(5) == 0


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

    def watch(child: Child) -> None:
        reports[child.name] = child.read_until("SIGTERM;", 5)[-1]
        with contextlib.suppress(TimeoutError):  # raised at the end of its output: its death
            child.read_until("never printed", 5)

    # The deaths as the kernel tells them (a pidfd is readable once its process exited),
    # in groups of those found dead at one wake-up: on a loaded machine a thread may
    # wake late and find several dead at once, which says nothing of their order (the
    # end of each one's output, read by threads, once came in the wrong order in CI).
    pidfds = {os.pidfd_open(c.pid): c.name for c in children}
    deaths: list[set[str]] = []

    def watch_deaths() -> None:
        while pidfds:
            ready, _, _ = select.select(list(pidfds), [], [], 10)
            if not ready:
                return
            deaths.append({pidfds.pop(fd) for fd in ready})
            for fd in ready:
                os.close(fd)

    watchers = [threading.Thread(target=watch, args=(c,), daemon=True) for c in children]
    watchers.append(threading.Thread(target=watch_deaths, daemon=True))
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
    rank = {"newest": 0, "middle": 1, "oldest": 2}
    assert sum(len(group) for group in deaths) == 3, deaths
    for earlier, later in itertools.pairwise(deaths):
        assert max(rank[n] for n in earlier) < min(rank[n] for n in later), deaths
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
