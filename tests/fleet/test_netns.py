"""The LAN the fleet runs on: hosts reach each other, a partition drops the packets
between two hosts both ways (and only theirs), a heal lets them through again, and
every namespace is gone afterwards."""

from __future__ import annotations

import subprocess
import sys

import pytest

from router.processes.supervisor import Supervisor
from tests.fleet.netns import Lan, lan

pytestmark = [pytest.mark.integration, pytest.mark.fleet]

PORT = 7000
SERVER = f"""
import socket
server = socket.create_server(("0.0.0.0", {PORT}))
print("listening", flush=True)
while True:
    conn, _ = server.accept()
    conn.sendall(b"hi")
    conn.close()
"""


def reaches(net: Lan, src: str, dst: str) -> bool:
    """Whether `src` gets the server's greeting from `dst` within a second."""
    code = (
        "import socket, sys\n"
        "try:\n"
        f"    s = socket.create_connection(({net.hosts[dst].ip!r}, {PORT}), timeout=1)\n"
        "    sys.exit(0 if s.recv(2) == b'hi' else 1)\n"
        "except OSError:\n"
        "    sys.exit(1)\n"
    )
    argv = net.hosts[src].argv([sys.executable, "-c", code])
    return subprocess.run(argv, check=False, timeout=10).returncode == 0


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], check=True, capture_output=True,
                          text=True).stdout  # fmt: skip


def test_a_partition_drops_both_ways_only_between_its_two_hosts_until_healed() -> None:
    with lan() as net, Supervisor() as sup:
        for name in ("a", "b", "c"):
            net.add(name)
        for name in ("a", "b"):
            server = sup.start(name, net.hosts[name].argv([sys.executable, "-c", SERVER]),
                               stdout="lines")  # fmt: skip
            server.read_until("listening", 10)
        assert reaches(net, "a", "b") and reaches(net, "b", "a") and reaches(net, "c", "b")
        net.partition("a", "b")
        assert not reaches(net, "a", "b") and not reaches(net, "b", "a")
        assert reaches(net, "c", "b") and reaches(net, "c", "a")
        net.heal("a", "b")
        assert reaches(net, "a", "b") and reaches(net, "b", "a")
        net.partition("b", "a")  # again, on the classes the first cut left
        assert not reaches(net, "a", "b")
        net.heal_all()
        assert reaches(net, "a", "b")
        run = net.run
    assert run not in namespaces()
