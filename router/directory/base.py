"""The user directory's seam: a user record, its limits, and the UserDirectory Protocol.

No SQL here: the push service's handlers and broadcast type against this, and
`router.directory.sql.SqlUserDirectory` implements it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from shared.errors import InvalidInput
from shared.uids import MAX_UID_LEN, check_uid

__all__ = [
    "MAX_TAGS",
    "MAX_TAG_LEN",
    "MAX_UID_LEN",
    "MAX_UPSERT",
    "PageReader",
    "UserDirectory",
    "UserRecord",
    "pages_after",
    "text_problem",
]

MAX_TAG_LEN = 64
MAX_TAGS = 32
MAX_UPSERT = 10_000


@dataclass(frozen=True, slots=True)
class UserRecord:
    """One user of the directory and their tags."""

    uid: str
    tags: tuple[str, ...] = ()

    @classmethod
    def parse(cls, uid: object, tags: object = ()) -> UserRecord:
        """A valid record from untrusted values; InvalidInput names the bad field (the
        uid: the one uid rule, `shared.uids`).

        Duplicate tags are dropped (keeping the first occurrence's order) before counting.
        """
        uid = check_uid(uid)
        if isinstance(tags, str | bytes) or not isinstance(tags, list | tuple):
            raise InvalidInput("tags", "must be a list of strings")
        for i, tag in enumerate(tags):
            if not isinstance(tag, str):
                raise InvalidInput(f"tags[{i}]", "must be a string")
            if problem := text_problem(tag, MAX_TAG_LEN):
                raise InvalidInput(f"tags[{i}]", problem)
        unique = tuple(dict.fromkeys(tags))
        if len(unique) > MAX_TAGS:
            raise InvalidInput("tags", f"at most {MAX_TAGS} distinct tags, got {len(unique)}")
        return cls(uid, unique)


def text_problem(value: str, max_len: int) -> str | None:
    if not 1 <= len(value) <= max_len:
        return f"must be 1-{max_len} characters, got {len(value)}"
    # PostgreSQL text cannot hold NUL, and lone surrogates are not UTF-8: refuse both here
    # rather than fail the whole batch in the database.
    if "\x00" in value:
        return "must not contain NUL"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode (no lone surrogates)"
    return None


class UserDirectory(Protocol):
    async def upsert(self, users: Sequence[UserRecord]) -> int: ...
    async def delete(self, uid: str) -> bool: ...
    async def get(self, uid: str) -> UserRecord | None: ...
    async def page(
        self, after: str | None, limit: int = 1000, tags_any: Sequence[str] | None = None
    ) -> list[str]: ...
    def iter_pages(
        self, limit: int = 1000, tags_any: Sequence[str] | None = None
    ) -> AsyncIterator[list[str]]: ...
    async def count(self) -> int: ...
    async def close(self) -> None: ...


class PageReader(Protocol):
    """What paging through a directory needs: its keyset `page`."""

    async def page(
        self, after: str | None, limit: int = 1000, tags_any: Sequence[str] | None = None
    ) -> list[str]: ...


async def pages_after(
    directory: PageReader, after: str | None, limit: int, tags_any: Sequence[str] | None
) -> AsyncIterator[list[str]]:
    """Every non-empty page of uids past `after` (None: from the start), in uid order;
    each page is its own short query, so users written meanwhile appear if their uid is
    past the current position."""
    while True:
        uids = await directory.page(after, limit, tags_any)
        if uids:
            yield uids
        if len(uids) < limit:
            return
        after = uids[-1]
