"""`imroute keys migrate`: the logs and inboxes of uids holding a brace, to the key names
they have now (`router.recovery.retag`), once, after every process runs the new version."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from router.directory.sql import SqlUserDirectory
from router.recovery.base import RecoveryLimits
from router.recovery.retag import Ambiguous, RetagReport, retag
from router.redis.client import connect_redis
from shared.clock import SystemClock
from shared.errors import InvalidInput
from shared.keys import KeySchema, braced
from shared.settings import ToolSettings
from shared.uids import check_uid

__all__ = ["keys_migrate", "read_uids", "register"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    keys = sub.add_parser("keys", help="the keys imroute keeps in Redis")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    mig = keys_sub.add_parser(
        "migrate",
        help="move the logs and inboxes of uids holding a brace to their new key names",
    )
    mig.add_argument(
        "--uids",
        help="a file of more uids, one per line (users that get P2P pushes but are not "
        "in the directory)",
    )
    mig.add_argument(
        "--no-directory",
        action="store_true",
        help="move the uids of --uids only (the directory is still asked whether a "
        "braced uid's SHA-1 hex is a user)",
    )
    mig.add_argument(
        "--ambiguous",
        choices=[a.value for a in Ambiguous],
        default=Ambiguous.QUARANTINE.value,
        help="the old keys of a braced uid whose SHA-1 hex is a user too: set aside under "
        "names nobody reads, to inspect and delete (quarantine, the default), or left to "
        "the hex user (hex)",
    )
    mig.add_argument("--dry-run", action="store_true", help="say what would move; move nothing")
    keys.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    listed = read_uids(Path(args.uids)) if args.uids else []
    if args.no_directory and not args.uids:
        raise InvalidInput("--uids", "required with --no-directory")
    settings = ToolSettings.load(os.environ)
    policy = Ambiguous(args.ambiguous)
    report = asyncio.run(
        keys_migrate(settings, listed, not args.no_directory, args.dry_run, policy)
    )
    _print(report, KeySchema(settings.redis_prefix), args.dry_run, policy)
    return 0


def read_uids(path: Path) -> list[str]:
    """The uids of a file, one per line (blank lines skipped); a bad one is named by its
    line number, never echoed."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput("--uids", f"{path}: cannot read it as UTF-8 text: {exc}") from None
    uids = []
    for n, line in enumerate(text.split("\n"), 1):
        uid = line.removesuffix("\r")
        if uid:
            check_uid(uid, f"--uids {path}:{n}")
            uids.append(uid)
    return uids


async def keys_migrate(
    settings: ToolSettings,
    listed: list[str],
    use_directory: bool,
    dry_run: bool,
    ambiguous: Ambiguous = Ambiguous.QUARANTINE,
) -> RetagReport:
    """Move the braced uids of `listed` and (`use_directory`) of the directory. Whether a
    hex is a user is asked of both either way: an ambiguous pair is told wherever the
    directory knows the hex user."""
    known = frozenset(listed)
    keys = KeySchema(settings.redis_prefix)
    limits = RecoveryLimits.from_settings(settings)
    async with (
        connect_redis(settings.redis_url, settings.redis_timeout_s) as redis,
        SqlUserDirectory.from_url(settings.db_url, SystemClock()) as directory,
    ):

        async def uids() -> AsyncIterator[str]:
            for uid in listed:
                yield uid
            if use_directory:
                async for page in directory.iter_pages():
                    for uid in page:
                        if braced(uid):
                            yield uid

        async def is_user(uid: str) -> bool:
            return uid in known or await directory.get(uid) is not None

        return await retag(
            redis, keys, limits, uids(), is_user, ambiguous=ambiguous, dry_run=dry_run
        )


def _print(report: RetagReport, keys: KeySchema, dry_run: bool, ambiguous: Ambiguous) -> None:
    would = "would move" if dry_run else "moved"
    for uid in report.renamed:
        print(f"{would} {uid!r}: its log and inbox, renamed (positions stay valid)")
    for uid, entries in report.merged:
        print(
            f"{would} {uid!r}: {entries} inbox entries appended to its new log and inbox "
            "(it had new keys already)"
        )
    for uid, hexed in report.ambiguous:
        if ambiguous is Ambiguous.HEX:
            print(
                f"left {uid!r}: its old keys are also those of the user {hexed!r}; they "
                "stay that user's (whose entries they hold cannot be told)"
            )
        else:
            print(
                f"ambiguous {uid!r}: its old keys are also those of the user {hexed!r}; "
                "whose entries they hold cannot be told, so neither user gets them"
            )
    aside = "would set aside" if dry_run else "set aside"
    for hexed in report.quarantined:
        names = " ".join(keys.quarantined_user_keys(hexed))
        print(f"{aside} the old keys of {hexed!r}, to inspect and delete: {names}")
    for hexed in report.quarantined_before:
        names = " ".join(keys.quarantined_user_keys(hexed))
        print(
            f"skipped {hexed!r}: set aside by an earlier run ({names}); its old keys hold "
            "what that user got since, and stay its"
        )
    print(
        f"{len(report.renamed)} renamed, {len(report.merged)} merged, "
        f"{len(report.ambiguous)} ambiguous, {report.without_keys} with no old keys"
    )
