"""Pure: a P2P push's receipt from its outcome, a message's fields for the webhook, and
the split of recipients into acked and unacked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from router.p2p.plan import PushOutcome
from router.receipts.base import ACKED, DELIVERED, EXPIRED, QUEUED, NewReceipt
from shared.models import Message

__all__ = ["PREVIEW_BYTES", "message_meta", "p2p_receipt", "preview_of", "split_acked"]

PREVIEW_BYTES = 256


def preview_of(content_json: bytes, limit: int = PREVIEW_BYTES) -> str:
    """The content's JSON text cut to at most `limit` bytes, never inside a character."""
    return content_json[:limit].decode(errors="ignore")


def message_meta(message: Message, preview: bool) -> dict[str, str]:
    """What a `message.unacked` event says of the message, kept with its receipt."""
    meta = {"mi": message.msg_id, "mt": str(message.msg_type), "fr": message.sender}
    if preview:
        meta["pv"] = preview_of(message.content_json)
    return meta


def p2p_receipt(
    message: Message,
    uids: Sequence[str],
    outcome: PushOutcome,
    meta: Mapping[str, str],
    store: bool = True,
    ttl_passed: bool = False,
) -> NewReceipt:
    """Delivered, or queued; expired where a gateway found its ttl_s passed, and where a
    `store:false` push reached no connection of a recipient (it is kept nowhere)."""
    delivered = set(outcome.delivered)
    # A gateway answers EXPIRED past the push's ttl_s, or past its call's deadline; in
    # the second case it is still in the inbox (queued), in the first it never will be.
    expired = set(outcome.expired) if ttl_passed else set()
    missed = QUEUED if store else EXPIRED
    states = {
        uid: DELIVERED if uid in delivered else EXPIRED if uid in expired else missed
        for uid in uids
    }
    online = len(outcome.delivered) + len(outcome.failed)
    return NewReceipt(message.push_id, "p2p", len(uids), online, states, meta, outcome.positions)


def split_acked(uids: Sequence[str], states: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(acked, unacked) of `uids`, in their order."""
    acked = [u for u in uids if states.get(u) == ACKED]
    done = set(acked)
    return acked, [u for u in uids if u not in done]
