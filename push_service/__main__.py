"""`python -m push_service` (also `imroute push-service`): run the HTTP API with uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from push_service.app import Worker, create_app
from push_service.http_server import run
from push_service.workers import serve_workers
from shared.errors import ImrouteError
from shared.gc_policy import GEN0_THRESHOLD, settle
from shared.logs import say
from shared.settings import PushSettings, misspelled


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="imroute push-service", description="Run the push service.")
    p.add_argument("--host", help="bind host (IMROUTE_HOST)")
    p.add_argument("--port", type=int, help="bind port (IMROUTE_PORT)")
    p.add_argument("--redis-url", help="Redis URL (IMROUTE_REDIS_URL)")
    p.add_argument(
        "--hedge-delay-ms",
        help="hedge bus publishes after this many ms (100-10000), or 'auto' "
        "(IMROUTE_HEDGE_DELAY_MS; hedging is off without it)",
    )
    p.add_argument(
        "--hedge-max-tokens", type=int, help="hedging token bucket size, 1-250 (default 50)"
    )
    p.add_argument(
        "--hedge-refill-ratio",
        type=float,
        help="tokens refilled per successful publish, 0.001-0.2 (default 0.1)",
    )
    # Set by the workers' supervisor (push_service.workers) for each worker it starts.
    p.add_argument("--listen-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    p.add_argument("--workers-dir", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    worker = (
        None if args.listen_fd is None else Worker(args.listen_fd, args.worker, args.workers_dir)
    )
    flags = {k: v for k, v in vars(args).items() if k not in ("listen_fd", "worker", "workers_dir")}
    try:
        settings = PushSettings.load(os.environ, **flags)
        if worker is None:  # said once, by the process people started
            for slip in misspelled(os.environ):
                say(slip, settings.log_format, "push-service", err=True, level=logging.WARNING)
        if worker is None and settings.workers > 1:
            # Checked here once, so a bad setting is one message, not one per worker.
            create_app(settings)
            return serve_workers(settings, argv)
        app = create_app(settings, worker=worker, on_ready=lambda: settle(GEN0_THRESHOLD))
    except ImrouteError as exc:
        print(f"imroute push-service: {exc}", file=sys.stderr)
        return 2
    run(app, settings, None if worker is None else worker.listener(), app.state.head_counts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
