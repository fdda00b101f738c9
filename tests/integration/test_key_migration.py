"""`imroute keys migrate`: what a uid holding a brace had under its old key names is
read under the new ones (real Redis, the command as a process, a real gateway and
WebSocket client; the move itself on a real Redis Cluster too)."""

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
from tests.integration.recovery_helpers import connected, open_ws, replay, replayed
from tests.integration.stack import contents, gateway, one_group, p2p

pytestmark = pytest.mark.integration


async def test_old_keys_are_read_after_the_migration_positions_and_all(
    redis_url: str, prefix: str, redis: Any, directory_db: str
) -> None:
    await write_old(redis, prefix, BRACED, "one", "two")
    old_seq = LegacyKeys(prefix).user_seq(BRACED)
    before = await redis.hgetall(old_seq)
    await users(directory_db, BRACED, "alice")
    # A dry run says what would move, and moves nothing.
    out = migrate(redis_url, prefix, directory_db, "--dry-run")
    assert f"would move {BRACED!r}" in out and "1 renamed" in out
    assert await redis.exists(old_seq) == 1
    out = migrate(redis_url, prefix, directory_db)
    assert "1 renamed, 0 merged, 0 ambiguous" in out, out
    keys = KeySchema(prefix)
    assert await redis.hgetall(keys.user_seq(BRACED)) == before  # same counter and epoch
    assert await redis.exists(old_seq) == 0
    assert await redis.pttl(keys.user_inbox(BRACED)) > 0
    async with gateway(redis_url, prefix, "gw1", "g1") as gw:
        ws = await open_ws(gw, BRACED)
        got, end = await replay(ws)
        assert contents(got) == ["one", "two"] and end["complete"] is True
        # Numbered in the log they were written in: the old epoch, still valid.
        assert {f["pos"].split("~")[1] for f in got} == {f"1.{before['e']}", f"2.{before['e']}"}
        await ws.close()
        assert await replayed(gw, HEXED) == []
        # A second run finds nothing left to move.
        assert "0 renamed, 0 merged, 0 ambiguous, 1 with no old keys" in migrate(
            redis_url, prefix, directory_db
        )


async def test_with_ambiguous_hex_a_braced_uid_whose_hex_is_a_user_too_is_left_to_that_user(
    redis_url: str, prefix: str, redis: Any, directory_db: str, tmp_path: Path
) -> None:
    await write_old(redis, prefix, BRACED, "mixed")
    listed = tmp_path / "uids.txt"
    listed.write_text(f"{BRACED}\n{HEXED}\n")
    flags = ("--uids", str(listed), "--no-directory", "--ambiguous", "hex")
    out = migrate(redis_url, prefix, directory_db, *flags)
    assert "0 renamed, 0 merged, 1 ambiguous" in out and repr(HEXED) in out
    async with gateway(redis_url, prefix, "gw1", "g1") as gw:
        assert await replayed(gw, BRACED) == []
        assert contents(await replayed(gw, HEXED)) == ["mixed"]


async def test_a_hex_with_a_live_route_is_a_user_too(
    redis_url: str, prefix: str, redis: Any, directory_db: str
) -> None:
    await write_old(redis, prefix, BRACED, "mine?")
    await users(directory_db, BRACED)
    async with gateway(redis_url, prefix, "gw1", "g1") as gw:
        other = await connected(gw, HEXED)
        out = migrate(redis_url, prefix, directory_db)
        assert "1 ambiguous" in out, out
        await other.close()


async def test_new_keys_written_before_the_migration_get_the_old_inbox_appended(
    redis_url: str, prefix: str, redis: Any, directory_db: str
) -> None:
    await write_old(redis, prefix, BRACED, "old")
    await users(directory_db, BRACED)
    async with one_group(redis_url, prefix) as (gw, http):
        await p2p(http, [BRACED], "new")  # the upgraded push service: new keys
        out = migrate(redis_url, prefix, directory_db)
        assert f"moved {BRACED!r}: 1 inbox entries appended" in out, out
        ws = await open_ws(gw, BRACED)
        got, _ = await replay(ws)
        assert sorted(contents(got)) == ["new", "old"]
        await ws.close()
    assert await redis.exists(*LegacyKeys(prefix).legacy_user_keys(BRACED)) == 0  # type: ignore[misc]


async def test_the_move_on_redis_cluster(cluster_url: str, prefix: str) -> None:
    uids = [BRACED, "a}b", "{x}", "plain"]
    async with connect_redis(cluster_url) as cluster:
        for uid in uids:
            await write_old(cluster, prefix, uid, f"for {uid}")

        async def listed() -> AsyncIterator[str]:
            for uid in uids:
                yield uid

        async def nobody(_: str) -> bool:
            return False

        keys = KeySchema(prefix)
        report = await retag(cluster, keys, RecoveryLimits(), listed(), nobody)
        assert sorted(report.renamed) == sorted([BRACED, "a}b", "{x}"])
        store = RedisRecoveryStore(cluster, keys, SystemClock(), RecoveryLimits())
        for uid in uids:
            history = await store.read_user(uid, None)
            assert [e.message.content_json for e in history.inbox] == [f'"for {uid}"'.encode()]
        assert (await store.read_user(HEXED, None)).inbox == []
        for uid in uids:
            await cluster.delete(keys.user_seq(uid), keys.user_log(uid), keys.user_inbox(uid))


async def test_on_redis_cluster_the_braced_uid_and_its_hex_keep_apart(
    cluster_url: str, prefix: str
) -> None:
    """The report's case through the store on a real cluster: an offline push to
    `bob{corp}` is neither read nor acked away by the uid that is its SHA-1 hex."""
    keys = KeySchema(prefix)
    async with connect_redis(cluster_url) as cluster:
        store = RedisRecoveryStore(cluster, keys, SystemClock(), RecoveryLimits())
        (seq,), _ = await store.append_queued(message("for bob"), [BRACED], FAR)
        assert (await store.read_user(HEXED, None)).inbox == []
        await store.ack([(HEXED, seq)])  # the other user's ack, of bob's number
        (entry,) = (await store.read_user(BRACED, None)).inbox
        assert entry.seq == seq and entry.message.content_json == b'"for bob"'
        for uid in (BRACED, HEXED):
            await cluster.delete(keys.user_seq(uid), keys.user_log(uid), keys.user_inbox(uid))
