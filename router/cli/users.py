"""`imroute users import FILE`: users from CSV or JSON Lines into the directory."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from router.directory.importer import ImportReport, import_file
from router.directory.sql import SqlUserDirectory
from shared.clock import SystemClock
from shared.settings import DirectorySettings

__all__ = ["register", "users_import"]


FILE_HELP = (
    "a .csv whose first line names its columns (uid, and tags split by |), or a .jsonl "
    'of {"uid": ..., "tags": [...]} lines'
)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    users = sub.add_parser("users", help="the user directory")
    users_sub = users.add_subparsers(dest="users_command", required=True)
    imp = users_sub.add_parser("import", help="import users from CSV or JSON Lines")
    imp.add_argument("file", help=FILE_HELP)
    imp.add_argument("--batch", type=int, default=5000, help="users per write (1-10000)")
    users.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    return users_import(DirectorySettings.load(os.environ), args.file, args.batch)


def users_import(settings: DirectorySettings, path: str, batch: int) -> int:
    """Import a CSV or JSON Lines file; bad lines are reported and skipped."""
    report = asyncio.run(_import(settings, Path(path), batch))
    for line, reason in report.bad:
        print(f"{path}:{line}: {reason}", file=sys.stderr)
    if report.skipped > len(report.bad):
        print(f"... and {report.skipped - len(report.bad)} more bad lines", file=sys.stderr)
    print(f"imported {report.imported} users, skipped {report.skipped} bad lines")
    return 1 if report.skipped and not report.imported else 0


async def _import(settings: DirectorySettings, path: Path, batch: int) -> ImportReport:
    async with SqlUserDirectory.from_url(settings.db_url, SystemClock()) as directory:
        return await import_file(directory, path, batch=batch, progress=_progress_bar())


def _progress_bar() -> _Bar:
    return _Bar(sys.stderr.isatty())


class _Bar:
    """A one-line progress bar on a terminal; a line per 10% otherwise."""

    def __init__(self, tty: bool) -> None:
        self._tty = tty
        self._last = -1

    def __call__(self, done: int, total: int) -> None:
        pct = 100 if total == 0 else min(100, done * 100 // total)
        if self._tty:
            filled = pct * 30 // 100
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {pct:3d}% {done}/{total}")
            if done >= total:
                sys.stderr.write("\n")
            sys.stderr.flush()
        elif pct // 10 != self._last // 10 or done >= total:
            print(f"{pct}% ({done}/{total} lines)", file=sys.stderr)
        self._last = pct
