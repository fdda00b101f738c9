"""A Redis Cluster on the fleet's Redis host: three masters, each with one replica, no
persistence. A 5-s node timeout (Redis's default is 15 s) makes a master's failover take
6-7 s: longer than a gateway's fleet record lives without a heartbeat (3 x 2 s), as any
failover under the defaults does.

Formed over unix sockets beside each node (the test process has no address on the
LAN), with the nodes meeting each other at the host's LAN address; every node is a
child of the fleet's Supervisor, stopped by its PID.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from router.processes.embedded_redis import find_redis_server, redis_answers
from router.processes.supervisor import Child, Supervisor
from tests.fleet.netns import Host

__all__ = ["FleetCluster"]

MASTERS = 3
BASE_PORT = 7000  # masters 7000-7002, their replicas 7003-7005
SLOTS = 16384
NODE_TIMEOUT_MS = 5000
FORM_S = 60.0


@dataclass
class FleetCluster:
    sup: Supervisor
    host: Host
    workdir: Path
    nodes: dict[int, Child] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"redis+cluster://{self.host.ip}:{BASE_PORT}"

    def sock(self, port: int) -> Path:
        return self.workdir / f"redis-{port}.sock"

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.sock(port)), socket_timeout=5,
                           decode_responses=True)  # fmt: skip

    def start(self) -> None:
        ports = [BASE_PORT + i for i in range(2 * MASTERS)]
        for port in ports:
            self.nodes[port] = self.sup.start(f"redis-{port}", self.host.argv([
                find_redis_server(),
                *("--bind", self.host.ip, "--port", str(port), "--protected-mode", "no"),
                *("--unixsocket", str(self.sock(port)), "--unixsocketperm", "700"),
                *("--cluster-enabled", "yes", "--cluster-node-timeout", str(NODE_TIMEOUT_MS)),
                *("--cluster-config-file", str(self.workdir / f"nodes-{port}.conf")),
                *("--save", "", "--appendonly", "no", "--dir", str(self.workdir)),
                *("--logfile", str(self.workdir / f"redis-{port}.log")),
            ]), stdout="null", stderr="null")  # fmt: skip
        deadline = time.monotonic() + FORM_S
        for port in ports:
            self._until(lambda p=port: redis_answers(f"unix://{self.sock(p)}", 0.5),
                        f"node {port} answers", deadline)  # fmt: skip
        clients = {port: self.client(port) for port in ports}
        try:
            for i in range(MASTERS):
                first, last = i * SLOTS // MASTERS, (i + 1) * SLOTS // MASTERS - 1
                clients[BASE_PORT + i].execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            for port in ports[1:]:
                clients[BASE_PORT].execute_command("CLUSTER", "MEET", self.host.ip, port)
            self._until(lambda: all(int(c.cluster("INFO")["cluster_known_nodes"]) == len(ports)
                                    for c in clients.values()), "every node knows all",
                        deadline)  # fmt: skip
            for i in range(MASTERS):
                master_id = clients[BASE_PORT + i].execute_command("CLUSTER", "MYID")
                clients[BASE_PORT + MASTERS + i].execute_command("CLUSTER", "REPLICATE",
                                                                 master_id)  # fmt: skip
            self._until(lambda: all(self._ready(c) for c in clients.values()),
                        "cluster_state:ok with every replica in sync", deadline)  # fmt: skip
        finally:
            for c in clients.values():
                c.close()

    def _ready(self, c: redis.Redis) -> bool:
        info = c.info("replication")
        if info["role"] == "master" and info.get("connected_slaves", 0) != 1:
            return False
        if info["role"] == "slave" and info.get("master_link_status") != "up":
            return False
        return bool(c.cluster("INFO")["cluster_state"] == "ok")

    def fail_over(self, master: int = 0) -> None:
        """SIGKILL one master; return once its replica is master and the cluster ok."""
        port, replica = BASE_PORT + master, BASE_PORT + MASTERS + master
        self.sup.stop(self.nodes.pop(port), signal.SIGKILL)
        c = self.client(replica)
        try:
            self._until(lambda: c.info("replication")["role"] == "master"
                        and c.cluster("INFO")["cluster_state"] == "ok",
                        f"replica {replica} promoted", time.monotonic() + FORM_S)  # fmt: skip
        finally:
            c.close()

    @staticmethod
    def _until(cond: Callable[[], bool], what: str, deadline: float) -> None:
        while not cond():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the fleet's Redis Cluster: timed out waiting for {what}")
            time.sleep(0.05)
