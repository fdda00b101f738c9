"""A new pooled Redis connection does not look redis-py's version up again (a walk of
the installed packages' metadata per connection, which stalled a loaded push service)."""

from __future__ import annotations

import pytest
import redis.utils

from router.redis.client import create_redis


def test_new_connections_reuse_the_version_resolved_once(monkeypatch: pytest.MonkeyPatch) -> None:
    client = create_redis("redis://127.0.0.1:6379/0")
    looked_up: list[str] = []

    def version(name: str) -> str:
        looked_up.append(name)
        return "0.0.0"

    monkeypatch.setattr(redis.utils.metadata, "version", version)
    connections = [client.connection_pool.make_connection() for _ in range(3)]
    assert looked_up == []
    infos = {c.driver_info.lib_version for c in connections if c.driver_info is not None}
    assert infos == {redis.__version__} and len(connections) == 3
