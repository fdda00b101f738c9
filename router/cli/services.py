"""`imroute push-service` and `imroute gateway`: run one service in this process.

Each service parses its own flags (`python -m push_service -h`), so these replace the
process with it rather than parsing anything here.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["SERVICES", "exec_service", "register"]

# subcommand -> the module that runs it
SERVICES = {"push-service": "push_service", "gateway": "socket_gateway"}


def register(sub: argparse._SubParsersAction[Any]) -> None:
    sub.add_parser(
        "push-service", help="run the push service (see: imroute push-service -h)", add_help=False
    )
    sub.add_parser("gateway", help="run one gateway (see: imroute gateway -h)", add_help=False)


def exec_service(command: str, argv: Sequence[str]) -> None:
    """Become `python -m <service> ARGV...` (never returns)."""
    module = SERVICES[command]
    os.execv(sys.executable, [sys.executable, "-m", module, *argv])
