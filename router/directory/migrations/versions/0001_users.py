"""users and user_tags

Revision ID: 0001
Revises:
Create Date: 2025-01-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _key(length: int) -> sa.String:
    # Byte-wise comparison on PostgreSQL too (SQLite's BINARY already is): the same uid
    # order everywhere. Spelled out here, not imported: a migration is a frozen snapshot.
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("uid", _key(128), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("uid", name="pk_users"),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "user_tags",
        sa.Column("uid", _key(128), nullable=False),
        sa.Column("tag", _key(64), nullable=False),
        sa.PrimaryKeyConstraint("uid", "tag", name="pk_user_tags"),
        sa.ForeignKeyConstraint(
            ["uid"], ["users.uid"], name="fk_user_tags_uid_users", ondelete="CASCADE"
        ),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_user_tags_tag_uid", "user_tags", ["tag", "uid"])


def downgrade() -> None:
    op.drop_index("ix_user_tags_tag_uid", table_name="user_tags")
    op.drop_table("user_tags")
    op.drop_table("users")
