"""`imroute db upgrade`: the user directory's schema migrations."""

from __future__ import annotations

import argparse
import os
from typing import Any

from router.directory.migrate import upgrade_sync
from shared.settings import DirectorySettings, redact_url

__all__ = ["db_upgrade", "register"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    db = sub.add_parser("db", help="the user directory's database")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    db_sub.add_parser("upgrade", help="apply the schema migrations to IMROUTE_DB_URL")
    db.set_defaults(run=lambda args: db_upgrade(DirectorySettings.load(os.environ)))


def db_upgrade(settings: DirectorySettings) -> int:
    """Apply the directory's migrations to IMROUTE_DB_URL (a no-op when up to date)."""
    upgrade_sync(settings.db_url)
    print(f"user directory at {redact_url(settings.db_url)} is up to date")
    return 0
