"""Free loopback ports for child servers: one port, or a block of ports at fixed offsets.

Each is picked below the kernel's ephemeral range (32768 and up by default), where no
outgoing connection takes a port: one picked inside it could be taken by a connection
of anything else on the machine between the check here and the server's bind (a test
suite running in parallel opens thousands)."""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Iterable
from pathlib import Path

__all__ = ["free_port", "free_port_block", "port_free"]

HOST = "127.0.0.1"
LOWEST = 10_000  # below it, the ports services are known by
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = HOST) -> int:
    """A port free at the time of the call, below the ephemeral range."""
    return free_port_block([0], host)


def port_free(port: int, host: str = HOST) -> bool:
    """Whether a server could bind `port` on `host` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # Like the servers themselves: a port in TIME_WAIT is free to reuse.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port_block(offsets: Iterable[int], host: str = HOST) -> int:
    """A base port such that base+offset is free for every offset (for a layout such as
    `imroute dev`'s PORT+i and PORT+1000+i), all below the ephemeral range."""
    wanted = list(offsets)
    top = max(wanted)
    for _ in range(200):
        base = random.randint(LOWEST, max(LOWEST + 1, _ephemeral_low() - 1 - top))
        if all(port_free(base + o, host) for o in wanted):
            return base
    raise RuntimeError("no free port block below the ephemeral range")


def _ephemeral_low() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    return 32768
