"""A LAN of network namespaces: one bridge in a namespace of its own and one namespace
per host, each with a veth on the bridge, an address in 10.231.0.0/24 and loopback up.

Nothing is added to the namespace the tests run in: every interface and address lives
in a namespace made here, named `imfleet<pid>x<nonce>-<host>` (the pid of the process
that made it), so parallel runs never collide, and namespaces left by a process that is
gone are deleted before a new LAN is built. Processes run inside a host with
`ip netns exec`, which execs in place: the child's PID is the process's own.

A partition drops packets silently, as a broken network does, without netem or
netfilter: each side's eth0 gets an HTB root qdisc with one class per cut peer, whose
leaf is `pfifo limit 0` (it drops every packet), chosen by a u32 filter on the peer's
address. Healing deletes the filter; the connections that were open carry on.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

__all__ = ["Host", "Lan", "lan", "netns_unavailable"]

SUBNET = "10.231.0"  # .1 is unused, hosts from .2 up
PREFIX = "imfleet"
_STALE = re.compile(rf"^{PREFIX}(\d+)x[0-9a-f]+-")


def netns_unavailable() -> str | None:
    """Why this machine cannot build a LAN of namespaces, or None when it can."""
    if os.geteuid() != 0:
        return "the fleet tier builds network namespaces: it needs root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "the fleet tier needs iproute2 (`ip netns`, `tc`)"
    probe = f"{PREFIX}{os.getpid()}xprobe-{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
    except RuntimeError as exc:
        return f"`ip netns add` fails here: {exc}"
    _del(probe)
    return None


def _cmd(argv: list[str], check: bool = True) -> str:
    """Run an iproute2 command; its output, or RuntimeError with its message."""
    done = subprocess.run(argv, check=False, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def _ip(*args: str) -> None:
    _cmd(["ip", *args])


def _tc(ns: str, *args: str) -> None:
    _cmd(["tc", "-n", ns, *args])


def _del(ns: str) -> None:
    _cmd(["ip", "netns", "del", ns], check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Delete the namespaces of earlier runs whose process is gone; their names."""
    listed = _cmd(["ip", "netns", "list"], check=False)
    gone = []
    for line in listed.splitlines():
        name = line.split()[0] if line.strip() else ""
        if (m := _STALE.match(name)) and not _alive(int(m.group(1))):
            _del(name)
            gone.append(name)
    return gone


@dataclass(frozen=True, slots=True)
class Host:
    name: str
    ns: str
    ip: str

    def argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside this host."""
        return ["ip", "netns", "exec", self.ns, *argv]


@dataclass
class Lan:
    run: str
    hosts: dict[str, Host] = field(default_factory=dict)
    _cuts: set[tuple[str, str]] = field(default_factory=set)  # (host, peer) dropped
    _qdisc: set[str] = field(default_factory=set)  # hosts with the HTB root

    @property
    def bridge_ns(self) -> str:
        return f"{self.run}-lan"

    def add(self, name: str) -> Host:
        """A new host on the bridge, its eth0 up with the next address, loopback up."""
        if name in self.hosts:
            raise ValueError(f"host {name} exists")
        index = len(self.hosts) + 2
        host = Host(name, f"{self.run}-{name}", f"{SUBNET}.{index}")
        _ip("netns", "add", host.ns)
        self.hosts[name] = host
        port = f"p{index}"
        _ip("-n", self.bridge_ns, "link", "add", port, "type", "veth", "peer", "name", "eth0",
            "netns", host.ns)  # fmt: skip
        _ip("-n", self.bridge_ns, "link", "set", port, "master", "br0", "up")
        _ip("-n", host.ns, "link", "set", "lo", "up")
        _ip("-n", host.ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        _ip("-n", host.ns, "link", "set", "eth0", "up")
        return host

    def partition(self, a: str, b: str) -> None:
        """Drop every packet between hosts `a` and `b`, both ways."""
        self._drop(a, b)
        self._drop(b, a)

    def heal(self, a: str, b: str) -> None:
        """Let packets between `a` and `b` through again."""
        for src, dst in ((a, b), (b, a)):
            if (src, dst) in self._cuts:
                _tc(self.hosts[src].ns, "filter", "del", "dev", "eth0", "parent", "1:",
                    "prio", self._minor(dst))  # fmt: skip
                self._cuts.discard((src, dst))

    def heal_all(self) -> None:
        for src, dst in list(self._cuts):
            self.heal(src, dst)

    def _minor(self, host: str) -> str:
        return self.hosts[host].ip.rsplit(".", 1)[1]

    def _drop(self, src: str, dst: str) -> None:
        """On `src`'s eth0, packets to `dst` go to a class whose queue holds nothing."""
        if (src, dst) in self._cuts:
            return
        ns, minor = self.hosts[src].ns, self._minor(dst)
        if src not in self._qdisc:
            # Unclassified packets (everything not cut) bypass HTB's shaping (default 0).
            _tc(ns, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb")
            self._qdisc.add(src)
        with contextlib.suppress(RuntimeError):  # the class stays across heal and cut
            _tc(ns, "class", "add", "dev", "eth0", "parent", "1:", "classid", f"1:{minor}",
                "htb", "rate", "1mbit")  # fmt: skip
            _tc(ns, "qdisc", "add", "dev", "eth0", "parent", f"1:{minor}", "handle",
                f"{minor}:", "pfifo", "limit", "0")  # fmt: skip
        _tc(ns, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio",
            minor, "u32", "match", "ip", "dst", f"{self.hosts[dst].ip}/32", "flowid",
            f"1:{minor}")  # fmt: skip
        self._cuts.add((src, dst))


@contextlib.contextmanager
def lan() -> Iterator[Lan]:
    """An empty LAN (the bridge only); every namespace it made is deleted on exit.
    Stop the processes inside first: deleting a namespace does not end them."""
    remove_stale()
    net = Lan(f"{PREFIX}{os.getpid()}x{secrets.token_hex(3)}")
    try:
        _ip("netns", "add", net.bridge_ns)
        _ip("-n", net.bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", net.bridge_ns, "link", "set", "br0", "up")
        yield net
    finally:
        for host in net.hosts.values():
            _del(host.ns)
        _del(net.bridge_ns)
