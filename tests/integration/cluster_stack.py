"""imroute's processes on a Redis Cluster, the bus on a plain Redis: for the cluster tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from router.processes.ports import free_port_block
from tests.conftest import API_KEY, SECRET
from tests.integration.procs import BIN, Proc, announced_ws_url, base_env, read_until, running
from tests.integration.redis_cluster import LocalCluster

__all__ = ["cluster_env", "processes"]


def cluster_env(
    redis_url: str, cluster: LocalCluster, prefix: str, db_url: str, **extra: str
) -> dict[str, str]:
    """A process's settings on `cluster`, the bus on `redis_url`, the directory at `db_url`."""
    return base_env(
        IMROUTE_REDIS_URL=cluster.url,
        IMROUTE_BUS_URL=redis_url,  # the bus is not sharded: a plain Redis
        IMROUTE_REDIS_PREFIX=prefix,
        IMROUTE_SECRET=SECRET,
        IMROUTE_API_KEY=API_KEY,
        IMROUTE_DB_URL=db_url,
        IMROUTE_GATEWAY_CACHE_S="0",
        **extra,
    )


@contextlib.contextmanager
def processes(env: dict[str, str], *gateway_ids: str) -> Iterator[tuple[str, str, list[Proc]]]:
    """Gateways of group g1 (`gateway_ids`) and a push service, with `env`, once all are
    up: the API's base URL, the first gateway's WebSocket URL, and the processes (the
    gateways', then the push service's)."""
    port = free_port_block([0])
    gateway = [str(BIN / "imroute"), "gateway", "--ws-port", "0", "--grpc-port", "0"]
    service = [str(BIN / "python"), "-m", "push_service", "--port", str(port)]
    with contextlib.ExitStack() as running_procs:
        gws = [
            running_procs.enter_context(running([*gateway, "--id", gid, "--group", "g1"], env))
            for gid in gateway_ids
        ]
        ps = running_procs.enter_context(running(service, env))
        ws_url = announced_ws_url(gws[0], 60)
        for gw in gws[1:]:
            read_until(gw, "ready", 60)
        read_until(ps, "Uvicorn running on", 60)
        yield f"http://127.0.0.1:{port}", ws_url, [*gws, ps]
