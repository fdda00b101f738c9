"""The user directory in SQL (SQLite or PostgreSQL): who exists, with which tags.

Broadcasts page through it in uid order with keyset pagination, so a page costs the
same at the millionth user as at the first.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import sqlalchemy.exc
from sqlalchemy import Select, delete, event, func, select, union
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from router.directory.base import (
    MAX_TAG_LEN,
    MAX_UPSERT,
    UserDirectory,
    UserRecord,
    pages_after,
    text_problem,
)
from router.directory.schema import user_tags, users
from shared.clock import Clock
from shared.closing import ClosedOnExit
from shared.errors import ConfigError, DirectoryUnavailable, InvalidInput
from shared.settings import redact_url

__all__ = [
    "MAX_PAGE",
    "MAX_TAGS_ANY",
    "MAX_UPSERT",
    "DirectoryUnavailable",
    "SqlUserDirectory",
    "UserDirectory",
    "UserRecord",
    "create_directory_engine",
    "page_statement",
    "translate_errors",
]

MAX_PAGE = 10_000
MAX_TAGS_ANY = 64
SQLITE_BUSY_TIMEOUT_MS = 5_000
# Rows per DELETE ... IN (...): far below SQLite's and asyncpg's limits of ~32k parameters.
_IN_CHUNK = 1000


@contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Map SQLAlchemy and driver errors raised inside to DirectoryUnavailable."""
    try:
        yield
    except sqlalchemy.exc.DBAPIError as exc:
        # The driver's own error, not SQLAlchemy's text, which repeats the statement and
        # every parameter (ten thousand uids for a full upsert).
        said = f"{what}: {type(exc.orig).__name__}: {exc.orig}"
        if _no_table(exc.orig):
            said += " (the directory's tables are not there: run `imroute db upgrade` "
            said += "against IMROUTE_DB_URL)"
        raise DirectoryUnavailable(said) from exc
    except (sqlalchemy.exc.SQLAlchemyError, OSError, TimeoutError) as exc:
        # OSError and TimeoutError: asyncpg raises them while connecting.
        raise DirectoryUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc


# PostgreSQL's SQLSTATE for a table that does not exist (undefined_table)
UNDEFINED_TABLE = "42P01"


def _no_table(error: object) -> bool:
    """A database without the directory's tables, as PostgreSQL says it (its SQLSTATE)
    and as SQLite does (which has no SQLSTATE: its message)."""
    sqlstate = getattr(error, "sqlstate", None)
    if sqlstate is not None:
        return bool(sqlstate == UNDEFINED_TABLE)
    return str(error).startswith("no such table")


def create_directory_engine(url: str, *, migrating: bool = False, **kwargs: Any) -> AsyncEngine:
    """An async engine for `url` (sqlite+aiosqlite or postgresql+asyncpg). `migrating`:
    for a migration, which on SQLite takes the write lock at its BEGIN (it reads its
    version before it writes: a deferred transaction would then fail at once against a
    writer, where this one waits the busy timeout) and runs with foreign keys off (a
    batch migration copies a table and drops the old one, which would cascade)."""
    try:
        parsed = make_url(url)
        if parsed.get_backend_name() not in {"sqlite", "postgresql"}:
            raise ConfigError(
                f"directory url {redact_url(url)}: only sqlite+aiosqlite:// and "
                "postgresql+asyncpg:// are supported"
            )
        if parsed.get_driver_name() == "asyncpg" and "sslmode" in parsed.query:
            # asyncpg's connect() takes no sslmode: it failed at the first query with a
            # TypeError
            raise ConfigError(
                f"directory url {redact_url(url)}: postgresql+asyncpg takes ?ssl=require "
                "(or verify-full, ...), not sslmode"
            )
        engine = create_async_engine(parsed, **kwargs)
    except (sqlalchemy.exc.ArgumentError, ValueError) as exc:
        # ValueError: a port that is not a number (made_url reads it as an int)
        raise ConfigError(f"directory url {redact_url(url)}: {exc}") from None
    except sqlalchemy.exc.InvalidRequestError as exc:
        # e.g. a sync driver (sqlite:// or postgresql+psycopg2://) given to the async engine
        raise ConfigError(f"directory url {redact_url(url)}: {exc}") from None
    if engine.dialect.name == "sqlite":
        event.listen(engine.sync_engine, "do_connect", _sqlite_folder_exists)
        event.listen(engine.sync_engine, "connect", _sqlite_on_connect)
        if migrating:
            event.listen(engine.sync_engine, "connect", _sqlite_foreign_keys_off)
        begin = "BEGIN IMMEDIATE" if migrating else "BEGIN"
        event.listen(engine.sync_engine, "begin", lambda conn: conn.exec_driver_sql(begin))
    return engine


def _sqlite_folder_exists(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> None:
    """A database file in a folder that does not exist is refused before it is opened,
    naming the folder: aiosqlite's failed open leaves its thread to finish after the
    caller's event loop may have closed (omnilib/aiosqlite#241), and its error ("unable
    to open database file") does not say why."""
    database = cargs[0] if cargs else None
    if not isinstance(database, str) or database == ":memory:" or cparams.get("uri"):
        return
    folder = os.path.dirname(os.path.abspath(database))
    if not os.path.isdir(folder):
        raise DirectoryUnavailable(
            f"SQLite database {database}: its folder {folder} does not exist"
        )


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # The driver's own transactions off: it begins none before DDL, so a migration that
    # failed half-way left its first tables behind, and running it again failed on them
    # ("table users already exists"). The engine's begin listener says BEGIN, so a
    # migration is one transaction, as on PostgreSQL (SQLAlchemy's recipe for
    # transactional DDL on SQLite).
    dbapi_connection.isolation_level = None
    # WAL lets pages be read while an import writes; the busy timeout makes a second
    # writer wait instead of failing at once; foreign keys are off unless asked for.
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")  # durable enough under WAL, much faster
    finally:
        cursor.close()


def _sqlite_foreign_keys_off(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys=OFF")
    finally:
        cursor.close()


def page_statement(after: str | None, limit: int, tags_any: Sequence[str] | None) -> Select[Any]:
    """The keyset query of one page: uids after `after`, in uid order, never OFFSET."""
    if tags_any is None:
        query = select(users.c.uid)
        if after is not None:
            query = query.where(users.c.uid > after)
        return query.order_by(users.c.uid).limit(limit)
    # One bounded range scan of the (tag, uid) index per tag, each stopping at `limit`:
    # the first `limit` distinct uids over all tags are among the first `limit` of each.
    # A single `tag IN (...)` scan would instead read every matching row after `after`
    # and sort them, for every page.
    per_tag = []
    for tag in tags_any:
        query = select(user_tags.c.uid).where(user_tags.c.tag == tag)
        if after is not None:
            query = query.where(user_tags.c.uid > after)
        # Wrapped in a subquery: SQLite refuses LIMIT on a bare member of a UNION.
        sub = query.order_by(user_tags.c.uid).limit(limit).subquery()
        per_tag.append(select(sub.c.uid))
    merged = union(*per_tag).subquery()  # UNION, not UNION ALL: a user with two tags once
    return select(merged.c.uid).order_by(merged.c.uid).limit(limit)


class SqlUserDirectory(ClosedOnExit):
    """The user directory in SQLite or PostgreSQL; an async context manager."""

    def __init__(self, engine: AsyncEngine, clock: Clock) -> None:
        self._engine = engine
        self._clock = clock
        self._dialect = engine.dialect.name

    @classmethod
    def from_url(cls, url: str, clock: Clock, **engine_kwargs: Any) -> SqlUserDirectory:
        """A directory over a new engine for `url`; the tables come from `migrate.upgrade`."""
        return cls(create_directory_engine(url, **engine_kwargs), clock)

    async def upsert(self, users: Sequence[UserRecord]) -> int:
        """Insert or replace (tags included) up to MAX_UPSERT users, all or none.

        Returns how many records were given; when a uid repeats, the last one wins.
        """
        if len(users) > MAX_UPSERT:
            raise InvalidInput("users", f"at most {MAX_UPSERT} per call, got {len(users)}")
        latest: dict[str, UserRecord] = {}
        for i, user in enumerate(users):
            try:
                checked = UserRecord.parse(user.uid, user.tags)
            except InvalidInput as exc:
                raise type(exc)(f"users[{i}].{exc.field}", exc.message) from None
            latest[checked.uid] = checked
        if not latest:
            return 0
        # Writing in uid order makes concurrent upserts take row locks in one order, so
        # two overlapping imports cannot deadlock on PostgreSQL.
        ordered = [latest[uid] for uid in sorted(latest)]
        now = datetime.fromtimestamp(self._clock.now_ms() / 1000, tz=UTC)
        with translate_errors("upserting users"):
            async with self._engine.begin() as conn:
                await self._write(conn, ordered, now)
        return len(users)

    async def _write(
        self, conn: AsyncConnection, records: Sequence[UserRecord], now: datetime
    ) -> None:
        insert = postgresql.insert if self._dialect == "postgresql" else sqlite.insert
        stmt = insert(users)
        stmt = stmt.on_conflict_do_update(
            index_elements=[users.c.uid],
            set_={"tags": stmt.excluded.tags, "updated_at": stmt.excluded.updated_at},
        )
        rows = [
            {"uid": r.uid, "tags": list(r.tags), "created_at": now, "updated_at": now}
            for r in records
        ]
        await conn.execute(stmt, rows)
        uids = [r.uid for r in records]
        for start in range(0, len(uids), _IN_CHUNK):
            chunk = uids[start : start + _IN_CHUNK]
            await conn.execute(delete(user_tags).where(user_tags.c.uid.in_(chunk)))
        tag_rows = [{"uid": r.uid, "tag": tag} for r in records for tag in r.tags]
        if tag_rows:
            await conn.execute(user_tags.insert(), tag_rows)

    async def delete(self, uid: str) -> bool:
        """Remove a user and their tags; True when they existed."""
        with translate_errors("deleting a user"):
            async with self._engine.begin() as conn:
                # The user's row first, as an upsert locks it (then its tags): two
                # writers of one user take their locks in one order and cannot deadlock
                # on PostgreSQL. Its tags go by ON DELETE CASCADE, and explicitly after,
                # for a SQLite connection that did not turn foreign keys on.
                result = await conn.execute(delete(users).where(users.c.uid == uid))
                await conn.execute(delete(user_tags).where(user_tags.c.uid == uid))
        return bool(result.rowcount)

    async def get(self, uid: str) -> UserRecord | None:
        """The user `uid` with their tags, or None."""
        with translate_errors("reading a user"):
            async with self._engine.connect() as conn:
                row = (
                    await conn.execute(select(users.c.uid, users.c.tags).where(users.c.uid == uid))
                ).first()
        return None if row is None else UserRecord(row.uid, tuple(row.tags))

    async def page(
        self, after: str | None, limit: int = 1000, tags_any: Sequence[str] | None = None
    ) -> list[str]:
        """Up to `limit` uids after `after` in uid order; with `tags_any`, only users
        having at least one of those tags (an empty `tags_any` matches nobody)."""
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidInput("limit", f"must be 1-{MAX_PAGE}, got {limit}")
        tags = _check_tags_any(tags_any)
        if tags is not None and not tags:
            return []
        with translate_errors("paging users"):
            async with self._engine.connect() as conn:
                result = await conn.execute(page_statement(after, limit, tags))
                return list(result.scalars())

    def iter_pages(
        self, limit: int = 1000, tags_any: Sequence[str] | None = None
    ) -> AsyncIterator[list[str]]:
        """Every page in order, each non-empty (`pages_after` from the start)."""
        return pages_after(self, None, limit, tags_any)

    async def count(self) -> int:
        """How many users the directory holds."""
        with translate_errors("counting users"):
            async with self._engine.connect() as conn:
                result = await conn.execute(select(func.count()).select_from(users))
                return int(result.scalar_one())

    async def close(self) -> None:
        """Close every pooled connection."""
        await self._engine.dispose()


def _check_tags_any(tags_any: Sequence[str] | None) -> list[str] | None:
    if tags_any is None:
        return None
    if isinstance(tags_any, str):
        raise InvalidInput("tags_any", "must be a list of tags, not one string")
    tags = list(dict.fromkeys(tags_any))
    if len(tags) > MAX_TAGS_ANY:
        raise InvalidInput("tags_any", f"at most {MAX_TAGS_ANY} tags, got {len(tags)}")
    for i, tag in enumerate(tags):
        if not isinstance(tag, str):
            raise InvalidInput(f"tags_any[{i}]", "must be a string")
        if problem := text_problem(tag, MAX_TAG_LEN):
            raise InvalidInput(f"tags_any[{i}]", problem)
    return tags
