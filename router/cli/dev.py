"""`imroute dev`: the whole stack on this machine (push service and gateways)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from router.processes.devstack import DevOptions, DevStack

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    dev = sub.add_parser("dev", help="run the whole stack locally (push service + gateways)")
    dev.add_argument("--gateways", type=int, default=2, help="number of gateways (default 2)")
    dev.add_argument("--groups", type=int, default=2, help="number of groups (default 2)")
    dev.add_argument(
        "--port",
        type=int,
        default=8080,
        help="push service port (default 8080); "
        "gateway i listens on PORT+i (WebSocket) and PORT+1000+i (gRPC)",
    )
    dev.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    return DevStack(DevOptions(args.gateways, args.groups, args.port), os.environ).run()
