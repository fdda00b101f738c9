"""Identifiers: push, message, batch and connection ids."""

from __future__ import annotations

import hashlib
import itertools
import os

__all__ = ["ConnIdFactory", "derived_id", "new_id"]

# A push takes three ids; one `os.urandom` (a syscall) per 256 of them, not per id.
_POOL_IDS = 256


class _IdPool:
    __slots__ = ("_at", "_bytes")

    def __init__(self) -> None:
        self._bytes = b""
        self._at = 0

    def reset(self) -> None:
        self._bytes, self._at = b"", 0

    def take(self) -> str:
        at = self._at
        if at >= len(self._bytes):
            self._bytes, at = os.urandom(16 * _POOL_IDS), 0
        self._at = at + 16
        return self._bytes[at : at + 16].hex()


_ids = _IdPool()
# A forked child must not hand out its parent's ids.
os.register_at_fork(after_in_child=_ids.reset)


def new_id() -> str:
    """A random 128-bit id (from the OS's CSPRNG) as 32 hex characters."""
    return _ids.take()


def derived_id(seed: str, *parts: object) -> str:
    """A 128-bit id as 32 hex characters, the same for the same seed and parts: the ids
    of a push sent again under its Idempotency-Key (the seed is a digest of the caller's
    scope and key, so nobody else's push can take them)."""
    text = "\0".join([seed, *map(str, parts)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


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
