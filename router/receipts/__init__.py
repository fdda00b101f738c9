"""Delivery receipts: per push, what became of each recipient (`base` says what)."""

from router.receipts.base import (
    ACKED,
    DELIVERED,
    EXPIRED,
    QUEUED,
    STATES,
    Counts,
    NewReceipt,
    ReceiptLimits,
    ReceiptLog,
    ReceiptReads,
    ReceiptUpdates,
    RecipientPage,
)

__all__ = [
    "ACKED",
    "DELIVERED",
    "EXPIRED",
    "QUEUED",
    "STATES",
    "Counts",
    "NewReceipt",
    "ReceiptLimits",
    "ReceiptLog",
    "ReceiptReads",
    "ReceiptUpdates",
    "RecipientPage",
]
