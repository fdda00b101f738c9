"""Bring the directory's tables to the newest schema with the packaged Alembic migrations.

No alembic.ini: the configuration is built here, so `imroute db upgrade` (or a test)
needs only a URL.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.util.exc import CommandError
from sqlalchemy import pool
from sqlalchemy.engine import Connection

from router.directory.sql import create_directory_engine, translate_errors
from shared.errors import ConfigError

__all__ = ["MIGRATIONS", "alembic_config", "upgrade", "upgrade_sync"]

# A plain directory next to this module (shipped as package data), which Alembic
# needs as a filesystem path.
MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(url: str) -> Config:
    """An Alembic configuration for the directory at `url`, without any .ini file."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    # The options are a ConfigParser, which would read a percent-encoded password's '%'
    # as interpolation.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


async def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the directory at `url` to `revision`; a no-op when already there."""
    config = alembic_config(url)
    engine = create_directory_engine(url, migrating=True, poolclass=pool.NullPool)
    try:
        with translate_errors("migrating the user directory"), _command_errors():
            async with engine.begin() as connection:
                await connection.run_sync(_upgrade, config, revision)
    finally:
        await engine.dispose()


def _upgrade(connection: Connection, config: Config, revision: str) -> None:
    # env.py runs on this connection, inside the caller's transaction.
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


def upgrade_sync(url: str, revision: str = "head") -> None:
    """`upgrade` for synchronous callers (a CLI); not from inside a running event loop."""
    config = alembic_config(url)
    with translate_errors("migrating the user directory"), _command_errors():
        command.upgrade(config, revision)


@contextmanager
def _command_errors() -> Iterator[None]:
    """Map Alembic's CommandError (e.g. a database at an unknown revision) to ConfigError."""
    try:
        yield
    except CommandError as exc:
        raise ConfigError(f"user directory migrations: {exc}") from exc
