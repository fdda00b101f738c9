"""`imroute token UID`: a client JWT, signed with IMROUTE_SECRET."""

from __future__ import annotations

import argparse
import os
from typing import Any

from shared.auth import issue_token
from shared.clock import SystemClock
from shared.errors import ConfigError, InvalidInput
from shared.settings import ClientTokenSettings

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    tok = sub.add_parser("token", help="print a client JWT for UID (needs IMROUTE_SECRET)")
    tok.add_argument("uid")
    tok.add_argument("--ttl", type=int, default=3600, help="seconds until it expires")
    tok.add_argument(
        "--audience", help="its aud claim (default: IMROUTE_JWT_AUDIENCE, which gateways check)"
    )
    tok.add_argument(
        "--issuer", help="its iss claim (default: IMROUTE_JWT_ISSUER, which gateways check)"
    )
    tok.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    settings = ClientTokenSettings.load(os.environ)
    if settings.secret is None:
        raise ConfigError("IMROUTE_SECRET: required to sign client tokens")
    max_ttl = settings.jwt_max_ttl_s
    if max_ttl and args.ttl > max_ttl:
        # A token the gateways would refuse is no use: say so now, not at connect time.
        raise InvalidInput(
            "--ttl",
            f"{args.ttl} is over IMROUTE_JWT_MAX_TTL_S ({max_ttl}): gateways would refuse "
            "the token",
        )
    token = issue_token(
        settings.secret.get_secret_value(),
        args.uid,
        args.ttl,
        SystemClock(),
        audience=args.audience or settings.jwt_audience,
        issuer=args.issuer or settings.jwt_issuer,
    )
    print(token)
    return 0
