"""Moving braced uids' recovery keys to the names they have now (`shared.keys`), once.

Before, a uid holding a brace ("bob{corp}") kept its seq, log and inbox under the tag of
its SHA-1 hex, ``useq:{71c9...}``: the very keys of the user whose uid is that hex. Now
they are ``useq:{71c9...}:bob{corp}``, nobody else's, and the brace-free user keeps
``useq:{71c9...}``. This moves what a braced user had to the new names.

What it cannot tell: whose an old key's entries are. An entry names no recipient, and
the braced user and the hex user wrote the same keys, so one key may hold either's
entries or both, interleaved. What it can tell: which braced uids exist (the ones it is
given: the directory's, and a list) and whether the hex is a user too (`is_user`: the
directory or the list; or a live route or a presence record in Redis). Such a pair is
*ambiguous*. A real one almost only exists because someone took the hex as a uid to
read the braced user's keys, so by default (`Ambiguous.QUARANTINE`) the old keys are
set aside under names no uid has (`KeySchema.quarantined_user_keys`), for the operator
to read and delete: neither user reads them, and the braced user starts afresh.
`Ambiguous.HEX` leaves them to the hex user, as that user read them before. Two braced
uids with one SHA-1 (a collision) are ambiguous too.

Each uid's move is one script in one slot (old, new and quarantine names share the
tag), so it is atomic on Redis Cluster too, and running it again changes nothing more:
a pair set aside before is left alone (its old names hold only what the hex user got
since), as long as its quarantine keys are there.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterable, Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

from router.recovery.base import RecoveryLimits
from router.recovery.lua import RETAG
from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from router.redis.scripts import ScriptRunner
from shared.clock import Clock, SystemClock
from shared.keys import KeySchema, braced, name_hash

__all__ = ["Ambiguous", "RetagReport", "retag"]

_NOTHING, _RENAMED, _MERGED, _SET_ASIDE_BEFORE, _SET_ASIDE = range(5)


class Ambiguous(enum.StrEnum):
    """What becomes of the old keys of an ambiguous pair."""

    QUARANTINE = "quarantine"  # set aside, nobody's, reported
    HEX = "hex"  # left to the hex user, reported


@dataclass(slots=True)
class RetagReport:
    """What the move did (or, dry run, would do), uid by uid."""

    renamed: list[str] = field(default_factory=list)  # keys renamed: positions still valid
    merged: list[tuple[str, int]] = field(default_factory=list)  # (uid, inbox entries appended)
    ambiguous: list[tuple[str, str]] = field(default_factory=list)  # (uid, the hex user)
    # hex tags whose old keys were set aside (`KeySchema.quarantined_user_keys`)
    quarantined: list[str] = field(default_factory=list)
    # hex tags set aside by an earlier run: their old names left to the hex user
    quarantined_before: list[str] = field(default_factory=list)
    without_keys: int = 0  # braced uids with no old key


async def retag(
    redis: RedisClient,
    keys: KeySchema,
    limits: RecoveryLimits,
    uids: AsyncIterable[str],
    is_user: Callable[[str], Awaitable[bool]],
    *,
    ambiguous: Ambiguous = Ambiguous.QUARANTINE,
    dry_run: bool = False,
    clock: Clock | None = None,
) -> RetagReport:
    """Move the old keys of every braced uid of `uids` (others are skipped); `is_user(hex)`
    says whether the uid that is a braced uid's SHA-1 hex is a user as well."""
    runner = ScriptRunner(redis, (RETAG,))
    now = (clock or SystemClock()).now_ms()
    # append_user.lua's ARGV after its data, as the store passes them
    tail = (
        now,
        now - limits.window_ms,
        limits.user_max,
        limits.window_ms,
        limits.user_seq_ttl_ms,
        limits.inbox_max,
        limits.inbox_ttl_ms,
    )
    report = RetagReport()
    for hexed, owners in (await _by_hex(uids)).items():
        uid = owners[0]
        names = (*keys.user_keys(hexed), *keys.user_keys(uid), *keys.quarantined_user_keys(hexed))
        call = partial(_run, runner, names, tail)
        how, entries = await call("probe")
        if how == _NOTHING:
            report.without_keys += len(owners)
            continue
        if how == _SET_ASIDE_BEFORE:
            report.quarantined_before.append(hexed)
            continue
        if len(owners) > 1 or await is_user(hexed) or await _seen(redis, keys, hexed):
            report.ambiguous.extend((u, hexed) for u in owners)
            if ambiguous is Ambiguous.QUARANTINE and (
                dry_run or (await call("quarantine"))[0] == _SET_ASIDE
            ):
                report.quarantined.append(hexed)
            continue
        if not dry_run:
            how, entries = await call("move")
        if how == _RENAMED:
            report.renamed.append(uid)
        elif how == _MERGED:
            report.merged.append((uid, entries))
    return report


async def _by_hex(uids: AsyncIterable[str]) -> dict[str, list[str]]:
    """The braced uids of `uids` by the SHA-1 hex that tagged their old keys."""
    by_hex: dict[str, list[str]] = {}
    async for uid in uids:
        if braced(uid):
            owners = by_hex.setdefault(name_hash(uid), [])
            if uid not in owners:
                owners.append(uid)
    return by_hex


@translate_errors
async def _run(
    runner: ScriptRunner, names: tuple[str, ...], tail: tuple[int, ...], mode: str
) -> tuple[int, int]:
    how, entries = await runner.run(RETAG, names, mode, *tail)
    return int(how), int(entries)


@translate_errors
async def _seen(redis: RedisClient, keys: KeySchema, uid: str) -> bool:
    """Whether Redis knows `uid` as a user: a live route, or a presence record (kept
    for weeks where webhooks are on). One key per call: they are in different slots."""
    for key in (keys.route(uid), keys.presence_prefix() + uid):
        if await redis.exists(key):
            return True
    return False
