"""The user directory: who exists and with which tags, paged through by broadcasts.

Migrations live in `router.directory.migrate`, imported on its own so that processes
which only read the directory never load Alembic.
"""

# No re-exports: importing one module of the package loads only what it needs.
