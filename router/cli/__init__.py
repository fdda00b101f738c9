"""The `imroute` command: dev stack, services, and client tokens."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from router.cli.directory import db_upgrade, users_import
from router.devtools.devstack import DevOptions, DevStack
from shared.auth import issue_token
from shared.clock import SystemClock
from shared.errors import AuthError, ConfigError, ImrouteError, InvalidInput
from shared.settings import Settings

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="imroute", description="imroute push-routing backend")
    sub = p.add_subparsers(dest="command", required=True)

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

    sub.add_parser(
        "push-service", help="run the push service (see: imroute push-service -h)", add_help=False
    )
    sub.add_parser("gateway", help="run one gateway (see: imroute gateway -h)", add_help=False)

    db = sub.add_parser("db", help="the user directory's database")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    db_sub.add_parser("upgrade", help="apply the schema migrations to IMROUTE_DB_URL")

    users = sub.add_parser("users", help="the user directory")
    users_sub = users.add_subparsers(dest="users_command", required=True)
    imp = users_sub.add_parser(
        "import", help="import users from CSV (uid,tags with tags split by |) or JSON Lines"
    )
    imp.add_argument("file")
    imp.add_argument("--batch", type=int, default=5000, help="users per write (1-10000)")

    tok = sub.add_parser("token", help="print a client JWT for UID (needs IMROUTE_SECRET)")
    tok.add_argument("uid")
    tok.add_argument("--ttl", type=int, default=3600, help="seconds until it expires")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    # The services parse their own flags, in their own process.
    if args_list and args_list[0] in ("push-service", "gateway"):
        module = "push_service" if args_list[0] == "push-service" else "socket_gateway"
        os.execv(sys.executable, [sys.executable, "-m", module, *args_list[1:]])
    args = _parser().parse_args(args_list)
    try:
        if args.command == "dev":
            return DevStack(DevOptions(args.gateways, args.groups, args.port), os.environ).run()
        if args.command == "token":
            return _token(args.uid, args.ttl)
        if args.command == "db":
            return db_upgrade(Settings.load(os.environ))
        if args.command == "users":
            return users_import(Settings.load(os.environ), args.file, args.batch)
    except (ImrouteError, RuntimeError, FileNotFoundError) as exc:
        print(f"imroute {args.command}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError | AuthError | InvalidInput) else 1
    return 2


def _token(uid: str, ttl: int) -> int:
    settings = Settings.load(os.environ)
    if settings.secret is None:
        raise ConfigError("IMROUTE_SECRET: required to sign client tokens")
    print(issue_token(settings.secret.get_secret_value(), uid, ttl, SystemClock()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
