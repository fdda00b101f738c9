"""`imroute dev` stopped by a signal, as a real process with an embedded Redis: SIGHUP
(its terminal closed) stops the stack as SIGTERM does, every child and the embedded
Redis stopped, its folder removed, exit 0."""

from __future__ import annotations

import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from router.processes.ports import free_port_block
from router.processes.supervisor import alive, descendants
from tests.integration.procs import BIN, base_env, dev_started, running

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_a_stop_signal_stops_every_child_and_removes_the_embedded_redis_folder(
    sig: signal.Signals, prefix: str, tmp_path: Path
) -> None:
    """Before: SIGHUP killed dev at once (no handler); its children died with it, but the
    embedded Redis's folder (its append-only file, its log) stayed in the temp folder."""
    port = free_port_block([0, 1, 2, 1001, 1002])
    env = base_env(
        IMROUTE_REDIS_URL="redis://127.0.0.1:1/0",  # none there: dev embeds one
        IMROUTE_REDIS_PREFIX=prefix,
        IMROUTE_DB_URL=f"sqlite+aiosqlite:///{tmp_path}/users.db",
    )
    with running([str(BIN / "imroute"), "dev", "--port", str(port)], env) as dev:
        banner = dev_started(dev)[0]
        found = re.search(r"started an embedded one at unix://(\S+)/redis\.sock", banner)
        assert found, banner
        folder = Path(found.group(1))
        assert folder.is_dir()
        children = descendants(dev.pid)
        assert len(children) >= 4  # push service, two gateways, the embedded redis-server

        dev.send_signal(sig)  # by its PID
        code = dev.wait(60)
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in children if alive(pid)], "children left behind"
    left = sorted(folder.iterdir()) if folder.exists() else None
    shutil.rmtree(folder, ignore_errors=True)  # not left in the temp folder when it fails
    assert left is None, f"{folder} left behind: {left}"
    assert code == 0  # as for SIGTERM and Ctrl-C
