"""The browser tests' stack as processes: a push service that takes the admin key, gateways."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.conftest import ADMIN_KEY
from tests.integration.http_raw import push_service
from tests.integration.procs import BIN, Proc, gateway_env, running

__all__ = ["ADMIN_KEY", "stack"]


@contextmanager
def stack(
    redis_url: str,
    prefix: str,
    tmp_path: Path,
    drain_window_s: str,
    *specs: tuple[str, str],
    **push_env: str,
) -> Iterator[tuple[int, dict[str, Proc]]]:
    """A push service process that takes the admin key (and `push_env`), and gateway
    processes (id, group) that drain in `drain_window_s`: the push service's port and the
    gateways by id."""
    env = gateway_env(redis_url, prefix, IMROUTE_DRAIN_WINDOW_S=drain_window_s)
    service = push_service(redis_url, prefix, tmp_path, IMROUTE_ADMIN_API_KEY=ADMIN_KEY, **push_env)
    with (
        service as (_, port),
        ExitStack() as gateways,
    ):
        procs = {}
        for gid, group in specs:
            argv = [str(BIN / "imroute"), "gateway", "--id", gid, "--group", group,
                    "--ws-port", "0", "--grpc-port", "0", "--heartbeat", "0.5"]  # fmt: skip
            procs[gid] = gateways.enter_context(running(argv, env))
        yield port, procs
