"""`python -m push_service` (also `imroute push-service`): run the HTTP API with uvicorn."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from push_service.app import create_app
from push_service.http_server import run
from shared.errors import ImrouteError
from shared.settings import Settings


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
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = Settings.load(os.environ, **vars(args))
        app = create_app(settings)
    except ImrouteError as exc:
        print(f"imroute push-service: {exc}", file=sys.stderr)
        return 2
    run(app, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
