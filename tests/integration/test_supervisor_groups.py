"""router.processes.supervisor with real child processes (`python -c` scripts, no mocks):
process groups, dying with the parent, and wait_until (how they treat their
processes: tests/integration/supervised.py).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from router.processes.ports import free_port, port_free
from router.processes.supervisor import Child, ChildExited, Supervisor, alive, descendants
from tests.integration.supervised import (
    GRACE_S,
    LISTENS_LATER,
    MIDDLE_SUPERVISOR,
    REPO,
    SLEEPER,
    gone_within,
    pid_from,
    py,
    with_grandchild,
)

pytestmark = pytest.mark.integration


# whole_group


@pytest.mark.parametrize("how", ["stop", "stop_all"])
def test_whole_group_also_stops_the_childs_children(
    sup: Supervisor, strays: list[int], how: str
) -> None:
    child, grandchild = with_grandchild(sup, strays, "group", "default", whole_group=True)
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
    child, grandchild = with_grandchild(sup, strays, "parent", "default", new_session=new_session)
    assert (os.getsid(child.pid) == child.pid) is new_session

    assert sup.stop(child, grace_s=5) == -signal.SIGTERM
    time.sleep(0.2)
    assert alive(grandchild)  # signals went to the child's PID only


def test_whole_group_sigkills_group_members_that_outlive_the_leader(
    sup: Supervisor, strays: list[int]
) -> None:
    child, grandchild = with_grandchild(sup, strays, "group", "ignore-sigterm", whole_group=True)
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
