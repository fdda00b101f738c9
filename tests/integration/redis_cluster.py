"""A real Redis Cluster on local ports, for tests of the cluster code paths.

Built from plain `redis-server` processes (the same binary the rest of the suite uses)
with CLUSTER ADDSLOTSRANGE, CLUSTER MEET and CLUSTER REPLICATE, so it needs no
`redis-cli`: three primaries by default, optionally with replicas (which a failover
test promotes by stopping a primary). Every process it starts is stopped by its own
handle.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis

from router.processes.embedded_redis import find_redis_server, redis_answers
from router.processes.ports import free_port_block
from router.processes.supervisor import Child, Supervisor

SLOTS = 16384
ATTEMPTS = 3
NODE_TIMEOUT_MS = 15000  # redis-server's own default


@dataclass
class LocalCluster:
    """A running cluster: `url` for the clients, the ports and processes for the test."""

    url: str
    primaries: list[int]  # ports, in slot order
    replicas: dict[int, list[int]]  # primary port -> its replicas' ports
    node_timeout_ms: int
    _nodes: Supervisor = field(repr=False)

    @property
    def ports(self) -> list[int]:
        """Every node's port, primaries first."""
        return [*self.primaries, *(p for ps in self.replicas.values() for p in ps)]

    def process(self, port: int) -> Child:
        return self._nodes.child(f"redis-{port}")

    def client(self, port: int) -> redis.Redis:
        """A plain (not cluster) client of one node; the caller closes it."""
        return redis.Redis(port=port, socket_timeout=5, decode_responses=True)

    def primary_of(self, key: str) -> int:
        """The port of the node serving `key`'s slot now."""
        with self.client(self.primaries[0]) as node:
            slot = int(node.execute_command("CLUSTER", "KEYSLOT", key))
        for port in reversed(self.ports):
            if self.process(port).poll() is not None:
                continue
            try:
                with self.client(port) as node:
                    for start, end, primary, *_ in node.execute_command("CLUSTER", "SLOTS"):
                        if int(start) <= slot <= int(end):
                            return int(primary[1])
            except redis.RedisError:
                continue  # stopped (SIGSTOP) or not answering: ask another
        raise RuntimeError(f"no node answered for slot {slot}")

    def wait_ok(self, timeout_s: float = 30.0, *, skip: tuple[int, ...] = ()) -> None:
        """Until every running node but `skip` says cluster_state:ok."""
        ports = [p for p in self.ports if p not in skip]
        deadline = time.monotonic() + timeout_s
        while True:
            states = []
            for port in ports:
                if self.process(port).poll() is not None:
                    continue
                try:
                    with self.client(port) as node:
                        states.append(node.cluster("INFO")["cluster_state"])
                except redis.RedisError:
                    states.append("unreachable")
            if states and all(s == "ok" for s in states):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not reach cluster_state:ok: {states}")
            time.sleep(0.05)

    def wait_primary(self, port: int, timeout_s: float = 30.0) -> None:
        """Until the node on `port` says it is a primary (a replica promoted)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.client(port) as node:
                if node.info("replication")["role"] == "master":
                    return
            _tick(deadline, f"the node on port {port} was not promoted")

    def pause(self, port: int) -> None:
        self.process(port).send_signal(signal.SIGSTOP)

    def resume(self, port: int) -> None:
        self.process(port).send_signal(signal.SIGCONT)


@contextmanager
def cluster_nodes(
    primaries: int = 3,
    replicas: int = 0,
    *,
    node_timeout_ms: int = NODE_TIMEOUT_MS,
    timeout_s: float = 20.0,
) -> Iterator[LocalCluster]:
    """A fresh cluster of `primaries`, each with `replicas` replicas, once every node says
    cluster_state:ok and every replica is in sync. `node_timeout_ms`: how long a node
    must be silent before the others fail it over (cluster-node-timeout)."""
    count = primaries * (1 + replicas)
    workdir = Path(tempfile.mkdtemp(prefix="imroute-cluster-"))
    try:
        # A port found free may be taken before a node binds it (another process's
        # outgoing connection): a node that exits at start means another block.
        for _ in range(ATTEMPTS):
            base = free_port_block([*range(count), *(10000 + i for i in range(count))])
            ports = [base + i for i in range(count)]
            with Supervisor() as running:
                for port in ports:
                    _start_node(running, port, workdir, node_timeout_ms)
                deadline = time.monotonic() + timeout_s
                if not _all_answer(running, ports, deadline):
                    continue
                heads = ports[:primaries]
                followers = {
                    head: ports[primaries + i * replicas : primaries + (i + 1) * replicas]
                    for i, head in enumerate(heads)
                }
                _form_cluster(heads, followers, deadline)
                yield LocalCluster(
                    f"redis+cluster://127.0.0.1:{heads[0]}",
                    heads,
                    followers,
                    node_timeout_ms,
                    running,
                )
                # A test may leave a node stopped: SIGTERM would wait for its grace.
                for child in running.children:
                    child.send_signal(signal.SIGCONT)
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


def _start_node(nodes: Supervisor, port: int, workdir: Path, node_timeout_ms: int) -> None:
    nodes.start(
        f"redis-{port}",
        [
            find_redis_server(),
            *("--port", str(port), "--bind", "127.0.0.1"),
            *("--cluster-enabled", "yes"),
            *("--cluster-config-file", str(workdir / f"nodes-{port}.conf")),
            *("--cluster-node-timeout", str(node_timeout_ms)),
            *("--save", "", "--appendonly", "no", "--dir", str(workdir)),
            *("--logfile", str(workdir / f"redis-{port}.log")),
        ],
        stdout="null",
        stderr="null",
    )


def _form_cluster(heads: list[int], followers: dict[int, list[int]], deadline: float) -> None:
    """Share the slots out evenly over `heads`, introduce every node, make each of
    `followers` a replica of its head, and wait until all agree and replicas synced."""
    everyone = [*heads, *(p for ps in followers.values() for p in ps)]
    clients = {port: redis.Redis(port=port, socket_timeout=5) for port in everyone}
    try:
        for i, port in enumerate(heads):
            first, last = i * SLOTS // len(heads), (i + 1) * SLOTS // len(heads) - 1
            clients[port].execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
        for port in everyone[1:]:
            clients[everyone[0]].execute_command("CLUSTER", "MEET", "127.0.0.1", port)
        for head, ports in followers.items():
            head_id = clients[head].execute_command("CLUSTER", "MYID").decode()
            for port in ports:
                # The replica must know the head before it can follow it.
                while head_id.encode() not in clients[port].execute_command("CLUSTER", "NODES"):
                    _tick(deadline, "a replica did not learn of its primary")
                clients[port].execute_command("CLUSTER", "REPLICATE", head_id)
        while not all(_ready(client, len(everyone)) for client in clients.values()):
            _tick(deadline, "the cluster did not reach cluster_state:ok")
        for ports in followers.values():
            for port in ports:
                while clients[port].info("replication").get("master_link_status") != "up":
                    _tick(deadline, f"the replica on port {port} did not sync")
    finally:
        for client in clients.values():
            client.close()


def _tick(deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise RuntimeError(what)
    time.sleep(0.05)


def _ready(client: redis.Redis, nodes: int) -> bool:
    info = client.cluster("INFO")
    return bool(info["cluster_state"] == "ok" and int(info["cluster_known_nodes"]) == nodes)
