"""The official Google Cloud Pub/Sub emulator, started for the test run where it is installed.

It is the gcloud SDK's `cloud-pubsub-emulator` launcher (a Java program), found:
1. at `IMROUTE_PUBSUB_EMULATOR`, if set;
2. as `cloud-pubsub-emulator` on PATH;
3. in the SDK's `platform/pubsub-emulator/bin/` beside the `gcloud` on PATH.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from router.processes.ports import free_port
from router.processes.supervisor import Supervisor

__all__ = ["PROJECT", "find_emulator", "running_emulator"]

PROJECT = "imroute-test"
LAUNCHER = "cloud-pubsub-emulator"
START_TIMEOUT_S = 60.0


def find_emulator() -> Path | None:
    """The emulator's launcher, or None when this machine has none."""
    if configured := os.environ.get("IMROUTE_PUBSUB_EMULATOR"):
        return Path(configured)
    if on_path := shutil.which(LAUNCHER):
        return Path(on_path)
    if gcloud := shutil.which("gcloud"):
        sdk = Path(gcloud).resolve().parent.parent
        candidate = sdk / "platform" / "pubsub-emulator" / "bin" / LAUNCHER
        if candidate.is_file():
            return candidate
    return None


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@contextmanager
def running_emulator(launcher: Path) -> Iterator[str]:
    """Start the emulator on a free loopback port; yields its host:port; stops it after."""
    if shutil.which("java") is None:
        raise RuntimeError("the Pub/Sub emulator needs java on PATH")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="imroute-pubsub-") as data_dir, Supervisor() as sup:
        log_path = Path(data_dir) / "emulator.log"
        with log_path.open("wb") as log:
            # Its own process group, so the launcher script and its JVM stop together; the
            # script execs java, which dies with this process even on a kill -9.
            proc = sup.start(
                "pubsub-emulator",
                [str(launcher), "--host=127.0.0.1", f"--port={port}", f"--dir={data_dir}"],
                stdout=log,
                stderr="stdout",
                whole_group=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                output = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the Pub/Sub emulator did not start:\n{output}")
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
