"""`imroute keys migrate`: what a uid holding a brace had under its old key names is
read under the new ones (real Redis, the command as a process, a real gateway and
WebSocket clients; the move itself on a real Redis Cluster too). Where a braced uid's
SHA-1 hex is a user too, the old keys the two shared are set aside, read by neither,
reported and left alone by a later run; the directory tells such a pair even with
--no-directory; a merge appends as the store does."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from router.directory.base import UserRecord
from router.directory.sql import SqlUserDirectory
from router.recovery.base import RecoveryLimits
from router.recovery.retag import retag
from router.recovery.store import RedisRecoveryStore
from router.redis.client import RedisClient, connect_redis
from shared.clock import SystemClock
from shared.keys import KeySchema
from shared.models import Message
from shared.positions import counter_of
from tests.integration.procs import base_env, imroute
from tests.integration.recovery_helpers import connected, open_ws, replay, replayed, write_legacy
from tests.integration.stack import contents, gateway, one_group, p2p

pytestmark = pytest.mark.integration

BRACED = "bob{corp}"
HEXED = hashlib.sha1(BRACED.encode()).hexdigest()
FAR = 2**41


class LegacyKeys(KeySchema):
    """The names before: a braced uid's keys under the bare tag of its SHA-1 hex."""

    def user_seq(self, uid: str) -> str:
        old = self.legacy_user_keys(uid)
        return old[0] if old else super().user_seq(uid)

    def user_log(self, uid: str) -> str:
        old = self.legacy_user_keys(uid)
        return old[1] if old else super().user_log(uid)

    def user_inbox(self, uid: str) -> str:
        old = self.legacy_user_keys(uid)
        return old[2] if old else super().user_inbox(uid)


def message(text: str) -> Message:
    now = SystemClock().now_ms()
    return Message(f"m-{text}", f"p-{text}", 0, "admin", f'"{text}"'.encode(), now)


async def write_old(redis: RedisClient, prefix: str, uid: str, *texts: str) -> None:
    """Queue messages for an offline `uid` as the version before wrote them: under the
    old names, and into an inbox of its own (`recovery_helpers.write_legacy`)."""
    keys = LegacyKeys(prefix)
    names = (keys.user_seq(uid), keys.user_log(uid), keys.user_inbox(uid))
    for text in texts:
        await write_legacy(redis, *names, message(text), FAR)


async def users(url: str, *uids: str) -> None:
    async with SqlUserDirectory.from_url(url, SystemClock()) as d:
        await d.upsert([UserRecord(u) for u in uids])


def migrate(redis_url: str, prefix: str, db_url: str, *flags: str) -> str:
    env = base_env(IMROUTE_REDIS_URL=redis_url, IMROUTE_REDIS_PREFIX=prefix, IMROUTE_DB_URL=db_url)
    done = imroute("keys", "migrate", *flags, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


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
