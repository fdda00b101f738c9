"""Free loopback ports for child servers: one port, or a block of ports at fixed offsets."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable

__all__ = ["free_port", "free_port_block", "port_free"]

HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    """A port the kernel just handed out (an ephemeral one), free at the time of the call."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


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
    `imroute dev`'s PORT+i and PORT+1000+i)."""
    wanted = list(offsets)
    for _ in range(200):
        base = random.randint(20000, 40000)
        if all(port_free(base + o, host) for o in wanted):
            return base
    raise RuntimeError("no free port block")
