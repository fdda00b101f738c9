"""The Userinfo store's seam: what P2P, multicast and the gateway need of it (no Redis)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from shared.errors import RegistryRefused, RegistryUnavailable
from shared.models import Registration, Route

__all__ = [
    "LOOKUP_CHUNK",
    "ConnectionEvents",
    "GroupLookup",
    "RecipientGroups",
    "RouteOp",
    "RouteRegistry",
    "apply_apart",
    "chunks",
]

LOOKUP_CHUNK = 1000

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RouteOp:
    """One write: register (True) or unregister (False) a connection.

    `new`: the connection's first write, refused when its user is at the per-user cap
    (a refresh of an admitted connection never is).
    """

    register: bool
    uid: str
    conn_id: str
    new: bool = False


@dataclass(slots=True)
class RecipientGroups:
    """Who of a chunk of uids is online: how many, and their uids per group id."""

    online: int = 0
    by_group: dict[str, list[str]] = field(default_factory=dict)


class RouteRegistry(Protocol):
    async def register(self, uid: str, conn_id: str) -> None: ...
    async def unregister(self, uid: str, conn_id: str) -> None: ...
    async def unregister_many(self, registrations: Iterable[Registration]) -> None: ...
    async def apply(self, ops: Sequence[RouteOp]) -> list[bool]: ...
    async def refresh(self, registrations: Iterable[Registration]) -> list[Registration]:
        """The routes' deadlines pushed forward; those whose route was not there."""
        ...

    async def lookup(self, uids: Sequence[str]) -> dict[str, list[Route]]: ...
    async def remove(self, routes: Iterable[Route]) -> None: ...


class ConnectionEvents(Protocol):
    """What follows route writes when presence is tracked (webhooks on): users with a new
    connection admitted, users an unregister left without a live route, and users it left
    with live routes on other gateways only."""

    async def track(
        self, connected: Sequence[str], emptied: Sequence[str], left: Sequence[str], /
    ) -> None: ...


class GroupLookup(Protocol):
    """What group multicast needs: per chunk of uids, who is online in which group."""

    async def lookup_groups(self, uids: Sequence[str]) -> RecipientGroups: ...


def chunks(items: Iterable[T], size: int = LOOKUP_CHUNK) -> Iterator[list[T]]:
    """`items` as lists of at most `size`."""
    if isinstance(items, list | tuple):  # a million-uid `to` list: slices, not item by item
        for start in range(0, len(items), size):
            part = items[start : start + size]
            yield part if isinstance(part, list) else list(part)
        return
    chunk: list[T] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


async def apply_apart(
    apply: Callable[[Sequence[RouteOp]], Awaitable[list[bool]]], ops: Sequence[RouteOp]
) -> list[bool | RegistryUnavailable]:
    """`apply(ops)`: each op's flag, or its error. When Redis refused a call of it (an
    error reply: one user's key holds another type) the round trip fails though the
    others' calls ran: each op goes again on its own (every op is idempotent), so that
    only the refused ones carry an error. Any other failure of the whole is raised."""
    try:
        return list(await apply(ops))
    except RegistryRefused as exc:
        if len(ops) == 1:
            return [exc]
    results: list[bool | RegistryUnavailable] = []
    for op in ops:
        try:
            results += await apply([op])
        except Exception as exc:  # this op's, whatever it is
            results.append(
                exc if isinstance(exc, RegistryUnavailable) else RegistryUnavailable(str(exc))
            )
    return results
