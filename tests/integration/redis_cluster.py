"""A real three-node Redis Cluster on local ports, for tests of the cluster code paths.

Built from plain `redis-server` processes (the same binary the rest of the suite uses)
with CLUSTER ADDSLOTSRANGE and CLUSTER MEET, so it needs no `redis-cli`. Every process
it starts is stopped by its own handle.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from router.devtools.embedded_redis import find_redis_server, redis_answers
from router.devtools.ports import free_port_block
from router.devtools.supervisor import Supervisor

SLOTS = 16384
ATTEMPTS = 3


@contextmanager
def local_cluster(nodes: int = 3, timeout_s: float = 20.0) -> Iterator[str]:
    """Yield a `redis+cluster://` URL of a fresh cluster of `nodes` primaries."""
    workdir = Path(tempfile.mkdtemp(prefix="imroute-cluster-"))
    try:
        # A port found free may be taken before a node binds it (another process's
        # outgoing connection): a node that exits at start means another block.
        for _ in range(ATTEMPTS):
            base = free_port_block([*range(nodes), *(10000 + i for i in range(nodes))])
            ports = [base + i for i in range(nodes)]
            with Supervisor() as nodes_running:
                for port in ports:
                    _start_node(nodes_running, port, workdir)
                deadline = time.monotonic() + timeout_s
                if not _all_answer(nodes_running, ports, deadline):
                    continue
                _form_cluster(ports, deadline)
                yield f"redis+cluster://127.0.0.1:{ports[0]}"
                return
        raise RuntimeError(f"no cluster node block started in {ATTEMPTS} tries")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _all_answer(nodes: Supervisor, ports: list[int], deadline: float) -> bool:
    """Every node answers (True), or one exited, its port taken (False)."""
    for port in ports:
        while not redis_answers(f"redis://127.0.0.1:{port}/0", 0.5):
            if nodes.exited():
                return False
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster node on port {port} did not start")
            time.sleep(0.05)
    return True


def _start_node(nodes: Supervisor, port: int, workdir: Path) -> None:
    nodes.start(
        f"redis-{port}",
        [
            find_redis_server(),
            *("--port", str(port), "--bind", "127.0.0.1"),
            *("--cluster-enabled", "yes"),
            *("--cluster-config-file", str(workdir / f"nodes-{port}.conf")),
            *("--save", "", "--appendonly", "no", "--dir", str(workdir)),
            *("--logfile", str(workdir / f"redis-{port}.log")),
        ],
        stdout="null",
        stderr="null",
    )


def _form_cluster(ports: list[int], deadline: float) -> None:
    """Share the slots out evenly, introduce the nodes, wait for cluster_state:ok."""
    clients = [redis.Redis(port=port, socket_timeout=5) for port in ports]
    try:
        for i, client in enumerate(clients):
            first, last = i * SLOTS // len(ports), (i + 1) * SLOTS // len(ports) - 1
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
        for port in ports[1:]:
            clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", port)
        while not all(_ready(client, len(ports)) for client in clients):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not reach cluster_state:ok")
            time.sleep(0.05)
    finally:
        for client in clients:
            client.close()


def _ready(client: redis.Redis, nodes: int) -> bool:
    info = client.cluster("INFO")
    return bool(info["cluster_state"] == "ok" and int(info["cluster_known_nodes"]) == nodes)
