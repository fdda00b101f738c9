"""Fixtures the integration tests share: child processes, the session's Redis Cluster,
mTLS certificates, a user directory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from router.directory.migrate import upgrade
from router.processes.supervisor import Supervisor, alive
from tests.integration.procs import directory_url
from tests.integration.redis_cluster import LocalCluster, cluster_nodes

ROOT = Path(__file__).resolve().parents[2]


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


@pytest.fixture
async def directory_db(tmp_path: Path) -> AsyncIterator[str]:
    """The URL of a user directory on SQLite in the test's folder, its tables made (what
    a push service started there uses: `procs.directory_url`)."""
    url = directory_url(tmp_path)
    await upgrade(url)
    yield url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A real Redis Cluster of three primaries, each with a replica, shared by the
    session (tests keep to their own key prefix and leave its topology as it was)."""
    with cluster_nodes(3, replicas=1) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def cluster_url(redis_cluster: LocalCluster) -> str:
    """The session's cluster as a `redis+cluster://` URL (tests keep to `prefix`)."""
    return redis_cluster.url


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two CAs, each with a node cert, made by scripts/grpc-certs, as the security page says."""
    ours, theirs = tmp_path_factory.mktemp("ours"), tmp_path_factory.mktemp("theirs")
    for folder in (ours, theirs):
        subprocess.run([str(ROOT / "scripts/grpc-certs"), str(folder)], check=True)
    return ours, theirs
