"""`imroute token UID`: a client JWT, signed with IMROUTE_SECRET."""

from __future__ import annotations

import argparse
import os
from typing import Any

from shared.auth import issue_token
from shared.clock import SystemClock
from shared.errors import ConfigError
from shared.settings import Settings

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    tok = sub.add_parser("token", help="print a client JWT for UID (needs IMROUTE_SECRET)")
    tok.add_argument("uid")
    tok.add_argument("--ttl", type=int, default=3600, help="seconds until it expires")
    tok.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    settings = Settings.load(os.environ)
    if settings.secret is None:
        raise ConfigError("IMROUTE_SECRET: required to sign client tokens")
    print(issue_token(settings.secret.get_secret_value(), args.uid, args.ttl, SystemClock()))
    return 0
