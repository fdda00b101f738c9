"""A broadcast's or multicast's receipt, written as the job resolves its recipients.

A multicast to a `to` list of at most IMROUTE_RECEIPTS_MAX_RECIPIENTS uids is listable:
each chunk's recipients are recorded as queued before any of its batches is published,
and the gateways move them on (delivered, acked). A multicast to a directory audience
(its size unknown until the end) and every broadcast keep counts only. A broadcast looks
no route up: its receipt counts whom the gateways wrote and acked, and takes its
recipients, the directory users its job paged, once they are all paged (`counted`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from router.fanout.outages import ride_out
from router.receipts.base import EXPIRED, QUEUED, NewReceipt, ReceiptLog
from router.routes.base import RecipientGroups
from shared.errors import ImrouteError

__all__ = ["FanoutReceipt"]

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class FanoutReceipt:
    """One job's receipt; `resolved` is `run_multicast`'s `on_resolved`."""

    """`due`: when, from now, its message.unacked is due (None: no event)."""

    receipts: ReceiptLog
    push_id: str
    mode: str
    listable: bool
    meta: Mapping[str, str]
    due: Callable[[], int] | None = None
    # A `store:false` push: a recipient offline when its chunk was resolved is never
    # written (nothing keeps it for a later connect), so expired, as a P2P push's is (a
    # listable receipt's; a counts-only one's counters would count a chunk resolved
    # again after a restart twice).
    stored: bool = True
    recipients: int = field(default=0, init=False)
    online: int = field(default=0, init=False)
    # Writes that failed after riding out an outage (the job goes on; its receipt is
    # short, and each is logged).
    failed: int = field(default=0, init=False)

    async def start(self) -> None:
        """Before the first batch: the receipt exists, so the gateways' marks land."""
        await self._write({})

    async def resolved(self, chunk: Sequence[str], found: RecipientGroups) -> None:
        self.recipients += len(chunk)
        self.online += found.online
        if not (self.listable or self.due is not None):
            await self._write({})
        elif self.stored or not self.listable:
            await self._write(dict.fromkeys(chunk, QUEUED))
        else:
            online = {uid for uids in found.by_group.values() for uid in uids}
            await self._write({uid: QUEUED if uid in online else EXPIRED for uid in chunk})

    async def counted(self, recipients: int) -> None:
        """A broadcast's recipients, all paged (its job's record has them before: the
        receipt keeps them for when that record is gone)."""
        self.recipients = recipients
        await self._write({})

    async def _write(self, states: Mapping[str, str]) -> None:
        receipt = NewReceipt(
            self.push_id, self.mode, self.recipients, self.online, states, self.meta,
            kept=self.stored,
        )  # fmt: skip
        due = self.due() if self.due is not None and states else 0
        try:
            await ride_out(
                lambda: self.receipts.record(receipt, self.listable, due),
                f"the receipt of push {self.push_id}",
            )
        except ImrouteError as exc:
            self.failed += 1
            log.warning("could not write the receipt of push %s: %s", self.push_id, exc)
