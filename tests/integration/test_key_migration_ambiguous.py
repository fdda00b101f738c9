"""`imroute keys migrate` where a braced uid's SHA-1 hex is a user too: the old keys the
two shared are set aside, read by neither, reported and left alone by a later run; the
directory tells such a pair even with --no-directory; a merge appends as the store does
(real Redis, the command as a process, a real gateway and WebSocket clients)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from router.recovery.base import RecoveryLimits
from router.recovery.retag import retag
from router.recovery.store import RedisRecoveryStore
from router.redis.client import connect_redis
from shared.clock import SystemClock
from shared.keys import KeySchema
from shared.positions import counter_of
from tests.integration.key_migration import (
    BRACED,
    FAR,
    HEXED,
    LegacyKeys,
    message,
    migrate,
    users,
    write_old,
)
from tests.integration.recovery_helpers import replayed
from tests.integration.stack import contents, one_group, p2p

pytestmark = pytest.mark.integration


async def test_an_ambiguous_pairs_old_keys_are_set_aside_and_read_by_neither(
    redis_url: str, prefix: str, redis: Any, directory_db: str
) -> None:
    await write_old(redis, prefix, BRACED, "bob's secret")
    old = LegacyKeys(prefix).legacy_user_keys(BRACED)
    assert old is not None
    aside = KeySchema(prefix).quarantined_user_keys(HEXED)
    await users(directory_db, BRACED, HEXED)
    out = migrate(redis_url, prefix, directory_db, "--dry-run")
    assert f"would set aside the old keys of {HEXED!r}" in out and "1 ambiguous" in out, out
    assert await redis.exists(*old) == 3 and await redis.exists(*aside) == 0
    out = migrate(redis_url, prefix, directory_db)
    assert "0 renamed, 0 merged, 1 ambiguous" in out and " ".join(aside) in out, out
    assert await redis.exists(*old) == 0 and await redis.exists(*aside) == 3
    assert await redis.pttl(aside[2]) > 0  # kept as long as the inbox would have been
    async with one_group(redis_url, prefix) as (gw, http):
        for uid in (BRACED, HEXED):
            assert await replayed(gw, uid) == [], uid
        # The hex user's pushes since are under the old names: a later run leaves them.
        await p2p(http, [HEXED], "later")
        out = migrate(redis_url, prefix, directory_db)
        assert f"skipped {HEXED!r}: set aside by an earlier run" in out, out
        assert contents(await replayed(gw, HEXED)) == ["later"]
    assert await redis.exists(*aside) == 3


async def test_no_directory_still_asks_the_directory_whether_the_hex_is_a_user(
    redis_url: str, prefix: str, redis: Any, directory_db: str, tmp_path: Path
) -> None:
    """The hex user is in the directory only, and offline: still ambiguous."""
    await write_old(redis, prefix, BRACED, "whose?")
    await users(directory_db, HEXED)
    listed = tmp_path / "uids.txt"
    listed.write_text(f"{BRACED}\n")
    out = migrate(redis_url, prefix, directory_db, "--uids", str(listed), "--no-directory")
    assert "0 renamed, 0 merged, 1 ambiguous" in out, out
    assert await redis.exists(*KeySchema(prefix).quarantined_user_keys(HEXED)) == 3


async def test_a_merge_appends_as_the_store_does_and_leaves_no_sequence_without_a_ttl(
    redis_url: str, prefix: str, redis: Any
) -> None:
    keys, limits = KeySchema(prefix), RecoveryLimits()
    new_seq = keys.user_seq(BRACED)

    async def nobody(_: str) -> bool:
        return False

    async def only(uid: str) -> AsyncIterator[str]:
        yield uid

    async with connect_redis(redis_url) as client:
        old = LegacyKeys(prefix).legacy_user_keys(BRACED)
        assert old is not None
        store = RedisRecoveryStore(client, keys, SystemClock(), limits)
        # Old keys whose inbox is empty (a log only); a new inbox whose sequence is gone.
        await write_old(client, prefix, BRACED, "logged")
        await client.delete(old[2])
        await store.append_queued(message("new"), [BRACED], FAR)
        await client.delete(new_seq)
        report = await retag(client, keys, limits, only(BRACED), nobody)
        assert report.merged == [(BRACED, 0)]
        assert await redis.pttl(new_seq) == -2  # no sequence made, none without a TTL
        # Old inbox entries appended after the new ones: numbered on, all with TTLs.
        await client.delete(*keys.user_keys(BRACED))
        await write_old(client, prefix, BRACED, "one", "two")
        await store.append_queued(message("three"), [BRACED], FAR)
        report = await retag(client, keys, limits, only(BRACED), nobody)
        assert report.merged == [(BRACED, 2)]
        history = await store.read_user(BRACED, None)
        assert [e.message.content_json for e in history.inbox] == [b'"three"', b'"one"', b'"two"']
        assert [counter_of(e.seq) for e in history.inbox] == [1, 2, 3]
        assert await redis.llen(keys.user_log(BRACED)) == 3
        seq, log, inbox = keys.user_keys(BRACED)
        for key in (seq, log):  # a TTL a quarter longer than needed (append_user.lua)
            assert 0 < await redis.pttl(key) <= limits.user_seq_ttl_ms * 5 // 4, key
        assert await redis.exists(inbox) == 0  # the inbox is the log's now
