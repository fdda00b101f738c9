"""Moving braced uids' recovery keys to the names they have now (`shared.keys`), once.

Before, a uid holding a brace ("bob{corp}") kept its seq, log and inbox under the tag of
its SHA-1 hex, ``useq:{71c9...}``: the very keys of the user whose uid is that hex. Now
they are ``useq:{71c9...}:bob{corp}``, nobody else's, and the brace-free user keeps
``useq:{71c9...}``. This moves what a braced user had to the new names.

What it cannot tell: whose an old key's entries are. An entry names no recipient, and
the braced user and the hex user wrote the same keys, so one key may hold either's
entries or both, interleaved. What it can tell: which braced uids exist (the ones it is
given: the directory's, and a list) and whether the hex is a user too (given as well,
or with a live route or a presence record in Redis). Such a pair is *ambiguous*: the
keys stay the hex user's, as that user read them before, and are reported; the braced
user starts afresh. Two braced uids with one SHA-1 (a collision) are ambiguous too.

Each uid's move is one script in one slot (old and new names share the tag), so it is
atomic on Redis Cluster too, and running it again changes nothing more.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterable, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from router.recovery.base import RecoveryLimits
from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from router.redis.scripts import Script, ScriptRunner
from shared.keys import KeySchema

__all__ = ["RetagReport", "braced", "retag"]

_RETAG = Script((Path(__file__).parent / "retag.lua").read_text(encoding="utf-8"))
_NOTHING, _RENAMED, _MERGED = 0, 1, 2


@dataclass(slots=True)
class RetagReport:
    """What the move did (or, dry run, would do), uid by uid."""

    renamed: list[str] = field(default_factory=list)  # keys renamed: positions still valid
    merged: list[tuple[str, int]] = field(default_factory=list)  # (uid, inbox entries appended)
    ambiguous: list[tuple[str, str]] = field(default_factory=list)  # (uid, the hex user)
    without_keys: int = 0  # braced uids with no old key


def braced(uid: str) -> bool:
    return "{" in uid or "}" in uid


async def retag(
    redis: RedisClient,
    keys: KeySchema,
    limits: RecoveryLimits,
    uids: AsyncIterable[str],
    is_user: Callable[[str], Awaitable[bool]],
    *,
    dry_run: bool = False,
) -> RetagReport:
    """Move the old keys of every braced uid of `uids` (others are skipped); `is_user(hex)`
    says whether the uid that is a braced uid's SHA-1 hex is a user as well."""
    by_tag: dict[tuple[str, str, str], list[str]] = {}
    async for uid in uids:
        old = keys.legacy_user_keys(uid)
        if old is not None and uid not in by_tag.get(old, ()):
            by_tag.setdefault(old, []).append(uid)
    runner = ScriptRunner(redis, (_RETAG,))
    report = RetagReport()
    # as the store's (`router.recovery.store`)
    seq_ttl_ms = max(limits.window_ms, limits.inbox_ttl_ms) + limits.window_ms
    for old, owners in by_tag.items():
        uid = owners[0]
        new = (keys.user_seq(uid), keys.user_log(uid), keys.user_inbox(uid))
        args = (
            limits.window_ms,
            seq_ttl_ms,
            limits.user_max,
            limits.inbox_max,
            limits.inbox_ttl_ms,
        )
        how, entries = await _run(runner, _RETAG.args((*old, *new), "1", *args))
        if how == _NOTHING:
            report.without_keys += len(owners)
            continue
        hexed = hashlib.sha1(uid.encode()).hexdigest()
        if len(owners) > 1 or await is_user(hexed) or await _seen(redis, keys, hexed):
            report.ambiguous.extend((u, hexed) for u in owners)
            continue
        if not dry_run:
            how, entries = await _run(runner, _RETAG.args((*old, *new), "0", *args))
        if how == _RENAMED:
            report.renamed.append(uid)
        elif how == _MERGED:
            report.merged.append((uid, entries))
    return report


@translate_errors
async def _run(runner: ScriptRunner, args: tuple[object, ...]) -> list[int]:
    reply = await runner.one(args)
    return [int(x) for x in reply]


@translate_errors
async def _seen(redis: RedisClient, keys: KeySchema, uid: str) -> bool:
    """Whether Redis knows `uid` as a user: a live route, or a presence record (kept
    for weeks where webhooks are on). One key per call: they are in different slots."""
    for key in (keys.route(uid), keys.presence_prefix() + uid):
        if await redis.exists(key):
            return True
    return False
