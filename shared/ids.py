"""Identifiers: push, message, batch and connection ids."""

from __future__ import annotations

import itertools
import os
import uuid

__all__ = ["ConnIdFactory", "new_id"]


def new_id() -> str:
    """A random 128-bit id as 32 hex characters."""
    return uuid.uuid4().hex


class ConnIdFactory:
    """Connection ids unique across gateways and restarts: gateway, boot nonce, counter.

    A stale unregister can only ever name its own connection, so it can never
    delete a newer connection of the same user.
    """

    def __init__(self, gateway_id: str) -> None:
        self._prefix = f"{gateway_id}.{os.urandom(4).hex()}."
        self._counter = itertools.count(1)

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._counter):x}"
