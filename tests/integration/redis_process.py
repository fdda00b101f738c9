"""A redis-server of a test's own on a TCP port, so it can be paused, killed and
started again at the same address (empty, or from its append-only file)."""

from __future__ import annotations

import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from router.processes.embedded_redis import find_redis_server, redis_answers
from router.processes.ports import free_port_block
from router.processes.supervisor import Child, Supervisor

__all__ = ["RedisProcess", "redis_process"]


class RedisProcess:
    """redis-server on 127.0.0.1:`port`, without persistence (a restart empties it), or
    with `appendonly` (a restart keeps what was written)."""

    def __init__(self, port: int, folder: Path, appendonly: bool = False) -> None:
        self.port, self.folder, self.appendonly = port, folder, appendonly
        self.url = f"redis://127.0.0.1:{port}/0"
        self.proc: Child | None = None

    def start(self) -> None:
        self.proc = Supervisor().start(
            "redis-server",
            [find_redis_server(), "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "yes" if self.appendonly else "no",
             "--dir", str(self.folder)],
            stdout="null", stderr="null",
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not redis_answers(self.url, 0.2):
            assert self.proc.poll() is None, "redis-server exited at start"
            assert time.monotonic() < deadline, "redis-server did not answer"
            time.sleep(0.02)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.stop(signal.SIGKILL)


@contextmanager
def redis_process(appendonly: bool = False) -> Iterator[RedisProcess]:
    with tempfile.TemporaryDirectory(prefix="imroute-redis-") as folder:
        server = RedisProcess(free_port_block([0]), Path(folder), appendonly)
        server.start()
        try:
            yield server
        finally:
            server.kill()
