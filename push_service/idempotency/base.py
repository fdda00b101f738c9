"""What an Idempotency-Key means, decided without I/O, and the store it is kept in.

A request with a key first claims it: the store records the request's fingerprint and a
`running` marker with a lease. Whoever holds the claim runs the request and completes
the entry with its answer, which later requests with the same key and fingerprint get
again. A request whose fingerprint differs is refused (the key was reused for another
request), and one that finds the entry running waits for it. An answer the caller
should retry (a 5xx) is not kept: the claim is released so the retry runs afresh.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

from shared.errors import InvalidInput

__all__ = [
    "HEADER",
    "MAX_KEY_LENGTH",
    "Answer",
    "Claimed",
    "IdempotencyStore",
    "Mismatch",
    "Outcome",
    "Running",
    "fingerprint",
    "is_kept",
    "key_hash",
    "parse_key",
    "scope_hash",
]

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255


def parse_key(value: str) -> str:
    """The header's value if it is 1-255 printable ASCII characters, else InvalidInput.

    Printable as the IETF draft's sf-string is: space to tilde. Leading and trailing
    spaces are not part of a header value (the HTTP parser strips them)."""
    if not value:
        raise InvalidInput(HEADER, "must not be empty")
    if len(value) > MAX_KEY_LENGTH:
        raise InvalidInput(HEADER, f"must be at most {MAX_KEY_LENGTH} characters")
    if not all(" " <= ch <= "~" for ch in value):
        raise InvalidInput(HEADER, "must be printable ASCII characters only")
    return value


def scope_hash(api_key: str) -> str:
    """The scope of a caller's keys: a digest of its API key, which is never stored."""
    return hashlib.sha256(b"imroute-idempotency-scope\0" + api_key.encode()).hexdigest()


def key_hash(key: str) -> str:
    """A digest of the header's value, so any printable value makes a safe Redis key."""
    return hashlib.sha256(key.encode()).hexdigest()


def fingerprint(method: str, path: str, body: bytes) -> str:
    """The request as the key binds it: the method, the path and the raw body bytes.

    The raw bytes, not the parsed body: a client retries by sending the same bytes again,
    and hashing them costs no second parse of a 160 MiB multicast. A retry that
    re-serialises the same JSON differently (key order, spaces) counts as another body."""
    digest = hashlib.sha256()
    digest.update(method.upper().encode())
    digest.update(b"\0")
    digest.update(path.encode())
    digest.update(b"\0")
    digest.update(body)
    return digest.hexdigest()


def is_kept(status: int) -> bool:
    """Whether an answer is stored for replay: 2xx and 4xx are, as Stripe keeps them (the
    same request would get the same answer again); a 5xx is not, so a retry can succeed
    once the failing part (Redis, the directory) is back."""
    return status < 500


@dataclass(frozen=True, slots=True)
class Answer:
    """The first request's answer, replayed: its status and its JSON body."""

    status: int
    body: bytes


@dataclass(frozen=True, slots=True)
class Claimed:
    """The caller holds the key: it runs the request, then completes or releases it."""

    token: str


@dataclass(frozen=True, slots=True)
class Running:
    """Another request with the key and the same fingerprint is still running."""


@dataclass(frozen=True, slots=True)
class Mismatch:
    """The key was used with another request (another fingerprint)."""


Outcome = Answer | Claimed | Running | Mismatch


class IdempotencyStore(Protocol):
    async def claim(self, scope: str, key: str, fingerprint: str) -> Outcome:
        """Claim `key` in `scope` for a request with `fingerprint`, unless it is taken:
        then the entry's answer, Running, or Mismatch."""
        ...

    async def complete(self, scope: str, key: str, token: str, answer: Answer) -> bool:
        """Store the answer of a claimed key for replay; False if the claim was lost
        (its lease lapsed and another request claimed the key)."""
        ...

    async def release(self, scope: str, key: str, token: str) -> None:
        """Give up a claim without an answer, so the next request with the key runs."""
        ...
