"""The user directory's tables: users with their tags, and a tag index to page by."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    ForeignKey,
    Index,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from router.directory.base import MAX_TAG_LEN, MAX_TAGS, MAX_UID_LEN

__all__ = [
    "MAX_TAGS",
    "MAX_TAG_LEN",
    "MAX_UID_LEN",
    "VERSION_TABLE",
    "UtcDateTime",
    "key_string",
    "metadata",
    "user_tags",
    "users",
]


# Alembic's bookkeeping table for these migrations. Not the default `alembic_version`:
# the directory may live in a database whose owner runs Alembic for their own tables.
VERSION_TABLE = "directory_alembic_version"

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "pk": "pk_%(table_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    }
)


def key_string(length: int) -> String:
    """A String compared byte-wise on every dialect.

    SQLite's BINARY collation already compares UTF-8 bytes; on PostgreSQL the "C"
    collation does the same. Keyset pages then come in one order everywhere (the order of
    Python's sorted()), and index comparisons skip the locale's rules.
    """
    return String(length).with_variant(String(length, collation="C"), "postgresql")


class UtcDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every dialect (SQLite stores it naive, in UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("UtcDateTime needs a timezone-aware datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# The source of truth for a user's tags is `users.tags` (their order as given); the rows of
# `user_tags` are derived from it in the same transaction by every write. Both tables are
# WITHOUT ROWID on SQLite, so rows are stored clustered by their primary key.
users = Table(
    "users",
    metadata,
    Column("uid", key_string(MAX_UID_LEN), primary_key=True),
    Column("tags", JSON, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    sqlite_with_rowid=False,
)

# One row per (user, tag). The (tag, uid) index answers "uids having this tag, after this
# uid, in uid order" as one range scan that stops at the page size, which is what keyset
# pages of `tags_any` need; the (uid, tag) primary key serves replacing a user's tags.
user_tags = Table(
    "user_tags",
    metadata,
    Column(
        "uid",
        key_string(MAX_UID_LEN),
        ForeignKey("users.uid", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("tag", key_string(MAX_TAG_LEN), nullable=False),
    PrimaryKeyConstraint("uid", "tag"),
    Index(None, "tag", "uid"),
    sqlite_with_rowid=False,
)
