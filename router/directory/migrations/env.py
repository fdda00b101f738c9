"""Alembic environment of the user directory: async engines, URL set by `migrate`.

`router.directory.migrate.upgrade` hands over an open connection in
`config.attributes["connection"]`; otherwise (`upgrade_sync`, or the alembic CLI) the
URL comes from the `sqlalchemy.url` main option and an async engine is made here.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import pool
from sqlalchemy.engine import Connection

from router.directory.schema import VERSION_TABLE, metadata
from router.directory.sql import create_directory_engine


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        # SQLite cannot ALTER most things in place; batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_online(url: str) -> None:
    # NullPool: one connection for one run, nothing left open afterwards.
    engine = create_directory_engine(url, migrating=True, poolclass=pool.NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
    finally:
        await engine.dispose()


def _main() -> None:
    config = context.config
    url = config.get_main_option("sqlalchemy.url")
    if context.is_offline_mode():
        context.configure(
            url=url,
            target_metadata=metadata,
            version_table=VERSION_TABLE,
            literal_binds=True,
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    if not url:
        raise RuntimeError("set the sqlalchemy.url option or pass a connection")
    asyncio.run(_run_online(url))


_main()
