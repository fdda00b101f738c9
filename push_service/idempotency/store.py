"""Idempotency-Key entries in Redis: one hash per (scope, key), claimed atomically.

Every step is one Lua script on one key, so it is atomic and cluster-safe: a claim
creates the entry (fingerprint, `running`, a random token) with the lease as its TTL
only if there is none, and otherwise reads it; completing or releasing checks the token,
so a holder whose lease lapsed (and whose key another request claimed since) cannot
write over the new holder's entry. A process that dies mid-request leaves a `running`
entry that expires with its lease.
"""

from __future__ import annotations

import secrets

from push_service.idempotency.base import (
    Answer,
    Claimed,
    Mismatch,
    Outcome,
    Running,
    key_hash,
)
from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from router.redis.scripts import Script, ScriptRunner
from shared.keys import KeySchema

__all__ = ["RedisIdempotencyStore"]

# One script per step (their comments say what they take and answer).
_CLAIM = Script.load(__package__, "claim")
_COMPLETE = Script.load(__package__, "complete")
_RELEASE = Script.load(__package__, "release")


class RedisIdempotencyStore:
    """Entries under `keys.idempotency`; answers kept `ttl_s`, claims leased `lease_s`."""

    def __init__(self, redis: RedisClient, keys: KeySchema, ttl_s: float, lease_s: float):
        self._keys = keys
        self._ttl_ms = int(ttl_s * 1000)
        self._lease_ms = int(lease_s * 1000)
        self._scripts = ScriptRunner(redis, (_CLAIM, _COMPLETE, _RELEASE))

    def _key(self, scope: str, key: str) -> str:
        return self._keys.idempotency(scope, key_hash(key))

    @translate_errors
    async def claim(self, scope: str, key: str, fingerprint: str) -> Outcome:
        token = secrets.token_hex(16)
        reply = await self._scripts.run(
            _CLAIM, (self._key(scope, key),), fingerprint, token, self._lease_ms
        )
        match reply[0]:
            case "claimed":
                return Claimed(token)
            case "mismatch":
                return Mismatch()
            case "done":
                # Redis decodes replies as UTF-8; the bodies are our own JSON, so they are.
                return Answer(int(reply[1]), str(reply[2]).encode())
            case _:
                return Running()

    @translate_errors
    async def complete(self, scope: str, key: str, token: str, answer: Answer) -> bool:
        done = await self._scripts.run(
            _COMPLETE, (self._key(scope, key),), token, answer.status, answer.body, self._ttl_ms
        )
        return bool(done)

    @translate_errors
    async def release(self, scope: str, key: str, token: str) -> None:
        await self._scripts.run(_RELEASE, (self._key(scope, key),), token)
