"""A broadcast's or multicast's receipt, written as the job resolves its recipients.

A multicast to a `to` list of at most IMROUTE_RECEIPTS_MAX_RECIPIENTS uids is listable:
each chunk's recipients are recorded as queued before any of its batches is published,
and the gateways move them on (delivered, acked). A multicast to a directory audience
(its size unknown until the end) and every broadcast keep counts only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from router.receipts.base import QUEUED, NewReceipt, ReceiptLog
from router.routes.base import RecipientGroups
from shared.errors import ImrouteError

__all__ = ["FanoutReceipt"]

log = logging.getLogger(__name__)


class FanoutReceipt:
    """One job's receipt; `resolved` is `run_multicast`'s `on_resolved`."""

    def __init__(
        self,
        receipts: ReceiptLog,
        push_id: str,
        mode: str,
        listable: bool,
        meta: Mapping[str, str],
        due: Callable[[], int] | None = None,
    ) -> None:
        """`due`: when, from now, its message.unacked is due (None: no event)."""
        self._due = due
        self._receipts = receipts
        self._push_id = push_id
        self._mode = mode
        self._listable = listable
        self._meta = meta
        self.recipients = 0
        self.online = 0
        self.failed = 0  # writes that failed (the job goes on; its receipt is short)

    async def start(self) -> None:
        """Before the first batch: the receipt exists, so the gateways' marks land."""
        await self._write({})

    async def resolved(self, chunk: Sequence[str], found: RecipientGroups) -> None:
        self.recipients += len(chunk)
        self.online += found.online
        wanted = self._listable or self._due is not None
        await self._write({uid: QUEUED for uid in chunk} if wanted else {})

    async def _write(self, states: Mapping[str, str]) -> None:
        receipt = NewReceipt(
            self._push_id, self._mode, self.recipients, self.online, states, self._meta
        )
        try:
            due = self._due() if self._due is not None and states else 0
            await self._receipts.record(receipt, self._listable, due)
        except ImrouteError as exc:
            self.failed += 1
            log.warning("could not write the receipt of push %s: %s", self._push_id, exc)
