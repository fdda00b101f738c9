"""imroute as a fleet of hosts on a `Lan`: a Redis host, a push service host, three
gateways in two groups (gw1, gw2 in g1; gw3 in g2), each in a namespace of its own, and
a clients host; every process started through one Supervisor and stopped by its PID.

The test process stays in its own namespace and reaches nothing over the network: it
reads Redis over a unix socket beside the fleet's Redis (a path, not an address), and
the clients host's driver (tests/fleet/driver.py) does the rest over the LAN.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from router.directory.migrate import upgrade_sync
from router.processes.devstack import gateway_argv, push_service_argv
from router.processes.embedded_redis import find_redis_server, redis_answers
from router.processes.supervisor import Supervisor
from tests.fleet.cluster import FleetCluster
from tests.fleet.netns import Host, Lan, lan
from tests.integration.fault_clients import API_KEY, SECRET
from tests.integration.procs import Proc, base_env, read_until

__all__ = ["GATEWAYS", "Fleet", "fleet"]

GATEWAYS = {"gw1": "g1", "gw2": "g1", "gw3": "g2"}
REDIS_PORT = 6379
API_PORT = 8080
WS_PORT, GRPC_PORT = 8101, 9101
START_S = 60.0  # a start-up under a loaded suite takes seconds
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Fleet:
    net: Lan
    sup: Supervisor
    workdir: Path
    env: dict[str, str]
    redis_argv: list[str] = field(default_factory=list)
    procs: dict[str, Proc] = field(default_factory=dict)
    logs: dict[str, list[str]] = field(default_factory=dict)  # output read so far
    cluster: FleetCluster | None = None

    @property
    def api_url(self) -> str:
        return f"http://{self.net.hosts['push'].ip}:{API_PORT}"

    @property
    def redis_sock(self) -> Path:
        return self.workdir / "redis.sock"

    def host(self, name: str) -> Host:
        return self.net.hosts[name]

    def start(self, name: str, host: str, argv: list[str], ready: str) -> Proc:
        proc = self.sup.start(name, self.host(host).argv(argv), env=self.env, cwd=REPO,
                              stdout="lines", stderr="stdout")  # fmt: skip
        self.procs[name] = proc
        if ready:
            self.read_until(name, ready)
        return proc

    def read_until(self, name: str, marker: str, timeout_s: float = START_S) -> list[str]:
        lines = read_until(self.procs[name], marker, timeout_s)
        self.logs.setdefault(name, []).extend(lines)
        return lines

    def start_redis(self) -> None:
        """A redis-server without persistence on the Redis host (and a unix socket)."""
        self.redis_sock.unlink(missing_ok=True)
        proc = self.sup.start("redis", self.host("redis").argv(self.redis_argv),
                              stdout="null", stderr="null")  # fmt: skip
        self.procs["redis"] = proc
        deadline = time.monotonic() + START_S
        while not redis_answers(f"unix://{self.redis_sock}", 0.5):
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (self.workdir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the fleet's redis-server did not start:\n{log}")
            time.sleep(0.05)

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        """Stop one process by its PID (SIGKILL: at once, nothing said to anyone)."""
        self.sup.stop(self.procs[name], sig, grace_s=10.0)
        self.output(name)
        del self.procs[name]

    def start_push(self) -> None:
        """The push service on its host, once it serves."""
        argv = push_service_argv(self.host("push").ip, API_PORT)
        self.start("push", "push", argv, "Uvicorn running on")

    def restart_redis_empty(self) -> None:
        """Stop redis-server, start a new one with no data on the same address."""
        self.stop("redis", signal.SIGKILL)
        self.start_redis()

    def output(self, name: str) -> list[str]:
        """Everything a process printed so far."""
        lines = self.logs.setdefault(name, [])
        proc = self.procs.get(name)
        while proc is not None and proc.lines is not None and not proc.lines.empty():
            line = proc.lines.get_nowait()
            if line is None:
                proc.lines.put(None)
                break
            lines.append(line)
        return lines


@contextlib.contextmanager
def fleet(workdir: Path, cluster: bool = False, **env: str) -> Iterator[Fleet]:
    """The whole fleet, started and ready (gateways announced); `env` adds IMROUTE_*
    settings for the push service and gateways. With `cluster`, imroute's Redis is a
    Redis Cluster on the Redis host, and the standalone Redis there carries the bus
    (as docs/operations/deployment.md says to do)."""
    with lan() as net, Supervisor() as sup:
        for name in ("redis", "push", *GATEWAYS, "clients"):
            net.add(name)
        redis_ip = net.hosts["redis"].ip
        db_url = f"sqlite+aiosqlite:///{workdir}/users.db"
        upgrade_sync(db_url)
        environ = base_env(
            IMROUTE_REDIS_URL=f"redis://{redis_ip}:{REDIS_PORT}/0",
            IMROUTE_REDIS_PREFIX="fleet:",
            IMROUTE_DB_URL=db_url,
            IMROUTE_API_KEY=API_KEY,
            IMROUTE_SECRET=SECRET,
            IMROUTE_INTERNAL_TOKEN="fleet-internal-token-0123456789abcdef",
            **env,
        )
        # Nothing on the LAN goes through a proxy (httpx and websockets honour these).
        environ = {k: v for k, v in environ.items() if not k.lower().endswith("_proxy")}
        f = Fleet(net, sup, workdir, environ)
        f.redis_argv = [
            find_redis_server(),
            *("--bind", redis_ip, "--port", str(REDIS_PORT), "--protected-mode", "no"),
            *("--unixsocket", str(f.redis_sock), "--unixsocketperm", "700"),
            *("--save", "", "--appendonly", "no", "--dir", str(workdir)),
            *("--logfile", str(workdir / "redis.log")),
        ]
        try:
            f.start_redis()
            if cluster:
                f.cluster = FleetCluster(sup, net.hosts["redis"], workdir)
                f.cluster.start()
                environ["IMROUTE_BUS_URL"] = environ["IMROUTE_REDIS_URL"]
                environ["IMROUTE_REDIS_URL"] = f.cluster.url
            for gid, group in GATEWAYS.items():
                argv = gateway_argv(gid, group, net.hosts[gid].ip, WS_PORT, GRPC_PORT)
                f.start(gid, gid, argv, "")
            f.start_push()
            for gid in GATEWAYS:
                f.read_until(gid, f"gateway {gid} group=")
            yield f
        finally:
            net.heal_all()
            sup.stop_all(grace_s=5.0)
