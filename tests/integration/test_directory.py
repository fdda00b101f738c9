"""The SQL user directory against real SQLite and PostgreSQL databases."""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest
import sqlalchemy
from alembic.operations import Operations
from sqlalchemy import func, pool, select
from sqlalchemy.dialects import sqlite

from router.directory.migrate import upgrade, upgrade_sync
from router.directory.schema import VERSION_TABLE, user_tags, users
from router.directory.sql import (
    MAX_UPSERT,
    DirectoryUnavailable,
    SqlUserDirectory,
    UserRecord,
    create_directory_engine,
    page_statement,
)
from router.testing import ManualClock
from shared.errors import ConfigError, InvalidInput

pytestmark = pytest.mark.integration

# The database that answers for admin work (CREATE / DROP DATABASE); each test gets a
# fresh database of its own, so runs never see each other's rows.
PG_ADMIN_URLS = (
    [os.environ["IMROUTE_TEST_POSTGRES_URL"]]
    if "IMROUTE_TEST_POSTGRES_URL" in os.environ
    else ["postgresql://postgres@127.0.0.1:5432/test", "postgresql://root@127.0.0.1:5432/test"]
)


async def _pg_admin() -> tuple[asyncpg.Connection, str]:
    problems = []
    for url in PG_ADMIN_URLS:
        try:
            return await asyncpg.connect(url, timeout=3), url
        except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
            problems.append(f"{url}: {type(exc).__name__}: {exc}")
    pytest.skip("PostgreSQL did not answer (" + "; ".join(problems) + ")")


@pytest.fixture(params=["sqlite", "postgresql"])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A URL of an empty database of this test's own."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'directory.db'}"
        return
    admin, admin_url = await _pg_admin()
    name = f"imroute_dir_{uuid.uuid4().hex[:12]}"
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        base = admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://")
        yield f"{base}/{name}"
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
async def directory(db_url: str, clock: ManualClock) -> AsyncIterator[SqlUserDirectory]:
    await upgrade(db_url)
    async with SqlUserDirectory.from_url(db_url, clock) as d:
        yield d


def random_uids(n: int, seed: int = 7) -> list[str]:
    """Distinct uids mixing case, digits, punctuation and non-ASCII, in random order."""
    rng = random.Random(seed)
    alphabet = "abcXYZ019-_.:@éü中"
    uids: set[str] = set()
    while len(uids) < n:
        uids.add("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))))
    out = list(uids)
    rng.shuffle(out)
    return out


async def test_upgrade_twice_is_a_noop(db_url: str, clock: ManualClock) -> None:
    await upgrade(db_url)
    async with SqlUserDirectory.from_url(db_url, clock) as d:
        await d.upsert([UserRecord("alice", ("a",))])
    await upgrade(db_url)
    await asyncio.to_thread(upgrade_sync, db_url)  # the CLI's path: URL read by env.py

    engine = create_directory_engine(db_url, poolclass=pool.NullPool)
    try:
        async with engine.connect() as conn:
            versions = (await conn.exec_driver_sql(f"SELECT * FROM {VERSION_TABLE}")).all()
            assert [tuple(v) for v in versions] == [("0001",)]
    finally:
        await engine.dispose()
    async with SqlUserDirectory.from_url(db_url, clock) as d:
        assert await d.get("alice") == UserRecord("alice", ("a",))


async def test_upgrade_sync_on_a_fresh_database(db_url: str, clock: ManualClock) -> None:
    await asyncio.to_thread(upgrade_sync, db_url)
    async with SqlUserDirectory.from_url(db_url, clock) as d:
        assert await d.count() == 0


async def test_2500_users_in_three_sorted_pages(directory: SqlUserDirectory) -> None:
    uids = random_uids(2500)
    assert await directory.upsert([UserRecord(uid, ()) for uid in uids]) == 2500
    assert await directory.count() == 2500

    pages = [page async for page in directory.iter_pages(limit=1000)]
    assert [len(p) for p in pages] == [1000, 1000, 500]
    flat = [uid for page in pages for uid in page]
    # Byte-wise order on both dialects, which for UTF-8 is Python's code-point order.
    assert flat == sorted(uids)

    # page() by hand: the same keyset walk, then nothing past the end.
    first = await directory.page(None, limit=1000)
    second = await directory.page(first[-1], limit=1000)
    assert first + second == flat[:2000]
    assert await directory.page(flat[-1]) == []


async def test_no_empty_page_when_the_total_is_a_multiple_of_the_limit(
    directory: SqlUserDirectory,
) -> None:
    await directory.upsert([UserRecord(f"u{i:04d}") for i in range(2000)])
    assert [len(p) async for p in directory.iter_pages(limit=1000)] == [1000, 1000]
    assert [p async for p in directory.iter_pages()] == [
        [f"u{i:04d}" for i in range(1000)],
        [f"u{i:04d}" for i in range(1000, 2000)],
    ]


async def test_upsert_replaces_tags_and_keeps_created_at(
    directory: SqlUserDirectory, db_url: str, clock: ManualClock
) -> None:
    created = datetime.fromtimestamp(clock.now_ms() / 1000, tz=UTC)
    await directory.upsert([UserRecord("alice", ("red", "blue")), UserRecord("bob", ("red",))])
    clock.advance(60)
    await directory.upsert([UserRecord("alice", ("green",))])

    assert await directory.get("alice") == UserRecord("alice", ("green",))
    assert await directory.get("bob") == UserRecord("bob", ("red",))
    assert await directory.get("nobody") is None
    assert await directory.page(None, tags_any=["red"]) == ["bob"]
    assert await directory.page(None, tags_any=["blue"]) == []
    assert await directory.page(None, tags_any=["green"]) == ["alice"]
    assert await directory.count() == 2

    engine = create_directory_engine(db_url, poolclass=pool.NullPool)
    try:
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(users.c.uid, users.c.created_at, users.c.updated_at).order_by(
                        users.c.uid
                    )
                )
            ).all()
            tag_rows = (await conn.execute(select(func.count()).select_from(user_tags))).scalar()
    finally:
        await engine.dispose()
    updated = datetime.fromtimestamp(clock.now_ms() / 1000, tz=UTC)
    assert [tuple(r) for r in rows] == [
        ("alice", created, updated),
        ("bob", created, created),
    ]
    assert all(r.created_at.tzinfo is not None for r in rows)
    assert tag_rows == 2  # alice/green, bob/red: the old tags are gone


async def test_tags_any_pages_exactly_the_tagged_users(directory: SqlUserDirectory) -> None:
    uids = random_uids(2500, seed=11)
    records = []
    for i, uid in enumerate(uids):
        tags = [name for name, every in (("red", 3), ("blue", 5), ("green", 7)) if i % every == 0]
        records.append(UserRecord(uid, tuple(tags)))
    await directory.upsert(records)

    def having(*wanted: str) -> list[str]:
        return sorted(r.uid for r in records if set(r.tags) & set(wanted))

    for wanted in (["red"], ["red", "blue"], ["blue", "green", "red"]):
        pages = [p async for p in directory.iter_pages(limit=100, tags_any=wanted)]
        flat = [uid for page in pages for uid in page]
        assert flat == having(*wanted), wanted  # sorted, no duplicates, nothing missing
        assert all(len(p) == 100 for p in pages[:-1])
    assert await directory.page(None, tags_any=["red", "red"]) == having("red")[:1000]
    assert await directory.page(None, tags_any=["purple"]) == []
    assert await directory.page(None, tags_any=[]) == []  # any of no tags: nobody
    assert len(await directory.page(None, limit=10, tags_any=["red", "blue"])) == 10


async def test_delete(directory: SqlUserDirectory, db_url: str) -> None:
    await directory.upsert([UserRecord("alice", ("red",)), UserRecord("bob", ("red",))])
    assert await directory.delete("alice") is True
    assert await directory.delete("alice") is False
    assert await directory.delete("nobody") is False
    assert await directory.page(None) == ["bob"]
    assert await directory.page(None, tags_any=["red"]) == ["bob"]
    assert await directory.count() == 1
    engine = create_directory_engine(db_url, poolclass=pool.NullPool)
    try:
        async with engine.connect() as conn:
            left = (await conn.execute(select(user_tags.c.uid))).scalars().all()
    finally:
        await engine.dispose()
    assert left == ["bob"]


async def test_more_than_10000_users_are_rejected_and_nothing_written(
    directory: SqlUserDirectory,
) -> None:
    with pytest.raises(InvalidInput) as info:
        await directory.upsert([UserRecord(f"u{i}") for i in range(MAX_UPSERT + 1)])
    assert info.value.field == "users"
    assert await directory.count() == 0
    # exactly the limit is fine
    assert await directory.upsert([UserRecord(f"u{i}", ("t",)) for i in range(MAX_UPSERT)]) == (
        MAX_UPSERT
    )
    assert await directory.count() == MAX_UPSERT


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (UserRecord(""), "users[1].uid"),
        (UserRecord("x" * 129), "users[1].uid"),
        (UserRecord("nul\x00"), "users[1].uid"),
        (UserRecord("a", ("",)), "users[1].tags[0]"),
        (UserRecord("a", ("ok", "t" * 65)), "users[1].tags[1]"),
        (UserRecord("a", tuple(f"t{i}" for i in range(33))), "users[1].tags"),
        (UserRecord("a", "red"), "users[1].tags"),  # type: ignore[arg-type]
        (UserRecord("a", (1,)), "users[1].tags[0]"),  # type: ignore[arg-type]
        (UserRecord(5), "users[1].uid"),  # type: ignore[arg-type]
    ],
)
async def test_bad_records_are_rejected_and_nothing_written(
    directory: SqlUserDirectory, bad: UserRecord, field: str
) -> None:
    with pytest.raises(InvalidInput) as info:
        await directory.upsert([UserRecord("good", ("fine",)), bad])
    assert info.value.field == field
    assert await directory.count() == 0


async def test_limits_are_inclusive_and_repeats_collapse(directory: SqlUserDirectory) -> None:
    long_uid = "u" * 128
    tags = tuple(f"{i:02d}" + "t" * 62 for i in range(32))
    # The same uid twice in one call: the last wins (PostgreSQL would otherwise refuse
    # to update one row twice in a statement), and duplicate tags collapse.
    n = await directory.upsert(
        [UserRecord(long_uid, ("old",)), UserRecord(long_uid, (*tags, tags[0]))]
    )
    assert n == 2
    assert await directory.get(long_uid) == UserRecord(long_uid, tags)
    assert await directory.count() == 1
    assert await directory.upsert([]) == 0


async def test_page_arguments_are_checked(directory: SqlUserDirectory) -> None:
    for limit in (0, 10_001):
        with pytest.raises(InvalidInput, match="limit"):
            await directory.page(None, limit=limit)
    with pytest.raises(InvalidInput, match="tags_any"):
        await directory.page(None, tags_any="red")
    with pytest.raises(InvalidInput, match="tags_any"):
        await directory.page(None, tags_any=["x" * 65])


async def test_concurrent_overlapping_upserts(directory: SqlUserDirectory) -> None:
    # Different orders over the same uids: no deadlock (PostgreSQL) and no "database is
    # locked" (SQLite waits on its busy timeout).
    uids = [f"u{i:04d}" for i in range(2000)]
    batches = [
        [UserRecord(uid, (f"w{w}",)) for uid in random.Random(w).sample(uids, len(uids))]
        for w in range(4)
    ]
    assert await asyncio.gather(*(directory.upsert(b) for b in batches)) == [2000] * 4
    assert await directory.count() == 2000
    tagged = [await directory.page(None, limit=10_000, tags_any=[f"w{w}"]) for w in range(4)]
    assert sorted(uid for page in tagged for uid in page) == uids  # each has one writer's tag


async def test_sqlite_pages_walk_the_indexes(tmp_path: Path, clock: ManualClock) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'plan.db'}"
    await upgrade(url)
    engine = create_directory_engine(url, poolclass=pool.NullPool)

    async def plan(after: str | None, tags: list[str] | None) -> str:
        stmt = page_statement(after, 1000, tags)
        sql = str(stmt.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}))
        async with engine.connect() as conn:
            rows = (await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql)).all()
        return "\n".join(str(r[-1]) for r in rows)

    try:
        plain = await plan("m", None)
        assert "SEARCH users USING PRIMARY KEY (uid>?)" in plain, plain
        assert "TEMP B-TREE" not in plain, plain  # no sort: the index is the order
        tagged = await plan("m", ["red", "blue"])
        # each tag is a range search of the (tag, uid) index, never a table scan; the
        # only sort is the UNION's merge of at most 2 x 1000 uids
        assert tagged.count("USING COVERING INDEX ix_user_tags_tag_uid (tag=? AND uid>?)") == 2
        assert "SCAN user_tags" not in tagged, tagged
    finally:
        await engine.dispose()


async def test_unreachable_databases_raise_directory_unavailable(
    tmp_path: Path, clock: ManualClock
) -> None:
    for url in (
        "postgresql+asyncpg://postgres@127.0.0.1:1/test",
        f"sqlite+aiosqlite:///{tmp_path / 'missing-dir' / 'x.db'}",
    ):
        async with SqlUserDirectory.from_url(url, clock) as d:
            with pytest.raises(DirectoryUnavailable) as raised:
                await d.count()
        with pytest.raises(DirectoryUnavailable):
            await upgrade(url)
        if url.startswith("sqlite"):
            # Refused before aiosqlite opens it (its failed open left a thread that
            # raised "Event loop is closed" once this test's loop had closed).
            folder = tmp_path / "missing-dir"
            assert f"its folder {folder} does not exist" in str(raised.value)


async def test_missing_tables_raise_directory_unavailable(
    tmp_path: Path, clock: ManualClock
) -> None:
    async with SqlUserDirectory.from_url(f"sqlite+aiosqlite:///{tmp_path}/x.db", clock) as d:
        with pytest.raises(DirectoryUnavailable, match="users"):
            await d.page(None)


def test_unsupported_urls_are_config_errors(clock: ManualClock) -> None:
    for url in ("sqlite:///x.db", "mysql+aiomysql://u@h/db", "not a url"):
        with pytest.raises(ConfigError):
            SqlUserDirectory.from_url(url, clock)
    # Before: a ValueError and a TypeError traceback, at the first query.
    for url, why in (
        ("postgresql+asyncpg://u:pw@127.0.0.1:notaport/db", "'notaport'"),
        ("postgresql+asyncpg://u:pw@127.0.0.1/db?sslmode=require", "not sslmode"),
    ):
        with pytest.raises(ConfigError, match=why) as raised:
            SqlUserDirectory.from_url(url, clock)
        assert "pw" not in str(raised.value)


async def test_a_delete_takes_its_locks_in_an_upserts_order(
    db_url: str, clock: ManualClock
) -> None:
    """An upsert locks a user's row, then its tags. A delete that took the tags first
    deadlocked against it on PostgreSQL (one of the two aborted after a second: a 503).
    Here a transaction stands where an upsert has locked the row; the delete must wait
    on the row holding nothing, so the upsert's next step, on the tags, goes through."""
    if not db_url.startswith("postgresql"):
        pytest.skip("row locks: PostgreSQL (SQLite locks the whole database)")
    await upgrade(db_url)
    async with SqlUserDirectory.from_url(db_url, clock) as d:
        await d.upsert([UserRecord("x", ("a", "b"))])
        raw = db_url.replace("postgresql+asyncpg://", "postgresql://")
        upserting = await asyncpg.connect(raw)
        try:
            tx = upserting.transaction()
            await tx.start()
            await upserting.execute("UPDATE users SET tags = tags WHERE uid = 'x'")  # its row
            deleting = asyncio.ensure_future(d.delete("x"))
            await asyncio.sleep(0.3)  # the delete has run up to its wait
            assert not deleting.done()
            # The upsert's second step: before, it waited on the delete's tag locks.
            await asyncio.wait_for(upserting.execute("DELETE FROM user_tags WHERE uid = 'x'"), 0.8)
            await tx.commit()
            assert await asyncio.wait_for(deleting, 5.0) is True
        finally:
            await upserting.close()
        assert await d.get("x") is None


@pytest.mark.parametrize("path", ["async", "cli"])
async def test_a_migration_that_fails_half_way_leaves_nothing_and_runs_again(
    db_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Its last step fails (a crash, a lock): nothing of it stays, and the next run
    makes it all. Before, on SQLite each CREATE committed on its own: the tables stayed,
    and every later run failed on "table users already exists"."""

    def fails(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the migration's last step failed")

    with monkeypatch.context() as patched:
        patched.setattr(Operations, "create_index", fails)
        with pytest.raises(RuntimeError, match="last step"):
            if path == "async":
                await upgrade(db_url)
            else:  # the CLI's: env.py makes its engine
                await asyncio.to_thread(upgrade_sync, db_url)
    engine = create_directory_engine(db_url, poolclass=pool.NullPool)
    try:
        async with engine.connect() as conn:
            tables = await conn.run_sync(lambda c: sqlalchemy.inspect(c).get_table_names())
        assert tables == []
    finally:
        await engine.dispose()
    await upgrade(db_url)
    async with SqlUserDirectory.from_url(db_url, clock) as d:
        await d.upsert([UserRecord("alice", ("a",))])
        assert await d.page(None, tags_any=["a"]) == ["alice"]


async def test_a_sqlite_migration_waits_for_a_writer_rather_than_failing(
    tmp_path: Path,
) -> None:
    """A migration reads its version, then writes: in a deferred transaction that failed
    at once ("database is locked") while another connection wrote; it now takes the
    write lock at its BEGIN, waiting the busy timeout like any writer."""
    db = tmp_path / "directory.db"
    writer = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("BEGIN IMMEDIATE")  # an import's write, say, under way
    release = asyncio.get_running_loop().call_later(0.5, writer.execute, "COMMIT")
    try:
        await upgrade(f"sqlite+aiosqlite:///{db}")
    finally:
        release.cancel()
        writer.close()
    async with SqlUserDirectory.from_url(f"sqlite+aiosqlite:///{db}", ManualClock()) as d:
        assert await d.count() == 0


async def test_a_database_never_migrated_says_to_run_db_upgrade(
    db_url: str, clock: ManualClock
) -> None:
    """Before: `ProgrammingError: relation "user_tags" does not exist` (or SQLite's `no such
    table`) and nothing said what to do."""
    async with SqlUserDirectory.from_url(db_url, clock) as d:
        with pytest.raises(DirectoryUnavailable, match=r"run `imroute db upgrade`"):
            await d.page(None, 10, ["vip"])
        with pytest.raises(DirectoryUnavailable, match=r"run `imroute db upgrade`"):
            await d.get("alice")
