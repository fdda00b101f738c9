"""The user directory: who exists and with which tags, paged through by broadcasts.

Migrations live in `router.directory.migrate`, imported on its own so that processes
which only read the directory never load Alembic.
"""

from __future__ import annotations

from router.directory.base import MAX_UPSERT, UserDirectory, UserRecord
from router.directory.importer import ImportReport, import_file
from router.directory.sql import MAX_PAGE, DirectoryUnavailable, SqlUserDirectory

__all__ = [
    "MAX_PAGE",
    "MAX_UPSERT",
    "DirectoryUnavailable",
    "ImportReport",
    "SqlUserDirectory",
    "UserDirectory",
    "UserRecord",
    "import_file",
]
