"""Users: the directory (who exists, with which tags) and where each is connected."""

from __future__ import annotations

from collections.abc import Sequence

from push_service.errors import NotFound
from push_service.schemas import UserIn
from router.directory.base import UserDirectory, UserRecord
from router.routes.base import RouteRegistry
from shared.models import Route

__all__ = ["Users"]


class Users:
    """Directory writes (bulk upsert, delete) and a user's live routes."""

    def __init__(self, directory: UserDirectory, registry: RouteRegistry) -> None:
        self._directory = directory
        self._registry = registry

    async def routes(self, uid: str) -> list[Route]:
        """One route per live connection of `uid` (none: offline)."""
        return (await self._registry.lookup([uid])).get(uid, [])

    async def upsert(self, users: Sequence[UserIn]) -> int:
        """Create or update the users, replacing their tags; how many were written."""
        records = [UserRecord.parse(u.uid, u.tags) for u in users]
        return await self._directory.upsert(records)

    async def delete(self, uid: str) -> None:
        """Remove a user from the directory; NotFound if it held none."""
        if not await self._directory.delete(uid):
            raise NotFound(f"no user {uid!r}")
