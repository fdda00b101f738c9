"""Route look-ups as spans (shared.tracing): one per chunk of uids, never per uid."""

from __future__ import annotations

from collections.abc import Sequence

from router.routes.base import GroupLookup, RecipientGroups
from shared.tracing import Tracer

__all__ = ["TracedGroupLookup"]


class TracedGroupLookup:
    """A GroupLookup whose every look-up is a `routes.lookup` span of the job's trace."""

    def __init__(self, inner: GroupLookup, tracer: Tracer) -> None:
        self._inner = inner
        self._tracer = tracer

    async def lookup_groups(self, uids: Sequence[str]) -> RecipientGroups:
        with self._tracer.start_as_current_span(
            "routes.lookup", attributes={"imroute.recipients": len(uids)}
        ) as span:
            found = await self._inner.lookup_groups(uids)
            span.set_attributes(
                {"imroute.online": found.online, "imroute.groups": len(found.by_group)}
            )
            return found
