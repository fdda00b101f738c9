"""The `imroute` command: one module per subcommand, registered here in help order.

dev            the whole stack on this machine          (dev.py)
push-service   one push service                         (services.py)
gateway        one gateway                              (services.py)
db upgrade     the directory's migrations               (db.py)
users import   users from CSV or JSON Lines             (users.py)
keys migrate   braced uids' logs to their new key names (keys.py)
token          a client JWT                             (token.py)
push, broadcast, multicast, status, drain
               the operator's commands, over the REST API (remote.py)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from router.cli import services
from shared.errors import AuthError, ConfigError, ImrouteError, InvalidInput

__all__ = ["main"]

# The operator's commands (remote.py), dispatched before anything else is imported: the
# directory's and the services' modules would double their start-up time.
REMOTE = ("push", "broadcast", "multicast", "status", "drain")


def _parser() -> argparse.ArgumentParser:
    from router.cli import db, dev, keys, remote, token, users

    p = argparse.ArgumentParser(prog="imroute", description="imroute push-routing backend")
    sub = p.add_subparsers(dest="command", required=True)
    for module in (dev, services, db, users, keys, token):
        module.register(sub)
    for name, text in remote.COMMANDS.items():  # they parse their own flags (remote.py)
        sub.add_parser(name, help=f"{text} (see: imroute {name} -h)", add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    # The services parse their own flags, in their own process.
    if args_list and args_list[0] in services.SERVICES:
        services.exec_service(args_list[0], args_list[1:])
    if args_list and args_list[0] in REMOTE:
        from router.cli import remote

        return remote.main(args_list)
    if not args_list or (args_list[0].startswith("-") and args_list[0] not in ("-h", "--help")):
        # argparse would say only "required: command", hiding a mistyped flag.
        _parser().print_usage(sys.stderr)
        what = f"{args_list[0]} is no option of imroute" if args_list else "no command given"
        print(f"imroute: {what}: name a command first (see: imroute -h)", file=sys.stderr)
        return 2
    args = _parser().parse_args(args_list)
    try:
        code: int = args.run(args)
        return code
    except (ImrouteError, RuntimeError, FileNotFoundError) as exc:
        print(f"imroute {args.command}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError | AuthError | InvalidInput) else 1


if __name__ == "__main__":
    sys.exit(main())
