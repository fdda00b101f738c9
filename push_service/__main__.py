"""`python -m push_service` (also `imroute push-service`): run the HTTP API with uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence

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


def start_warnings(settings: PushSettings, environ: Mapping[str, str]) -> list[str]:
    """What the push service says at its start of settings that do not do what their
    setter meant (it starts all the same)."""
    said = misspelled(environ)
    unused = {"job_publish_retries", "job_publish_backoff_s"} & settings.model_fields_set
    if unused:
        names = ", ".join(f"IMROUTE_{name.upper()}" for name in sorted(unused))
        said.append(
            f"{names}: accepted and no longer used; a job batch's publish is retried by the "
            "bus itself, up to 60 s"
        )
    if settings.secret is None:
        said.append(
            "IMROUTE_SECRET is not set: GET /v1/dispatch answers 503, as it checks the "
            "clients' tokens with it, so clients that connect through dispatch (both SDKs) "
            "cannot; give the push service the gateways' secret"
        )
    return said


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
            for warning in start_warnings(settings, os.environ):
                say(
                    f"imroute push-service: warning: {warning}",
                    settings.log_format,
                    "push-service",
                    err=True,
                    level=logging.WARNING,
                )
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
