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

from router.idempotency.base import (
    Answer,
    Claimed,
    Mismatch,
    Outcome,
    Running,
    key_hash,
)
from router.redis.client import RedisClient
from router.redis.errors import translate_errors
from shared.keys import KeySchema

__all__ = ["RedisIdempotencyStore"]

# ARGV: fingerprint, token, lease ms. Returns {"claimed"} | {"mismatch"} | {"running"}
# | {"done", status, body}.
_CLAIM = """
local e = redis.call('HMGET', KEYS[1], 'fp', 'state', 'status', 'body')
if not e[1] then
  redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'state', 'running', 'token', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {'claimed'}
end
if e[1] ~= ARGV[1] then return {'mismatch'} end
if e[2] == 'done' then return {'done', e[3], e[4]} end
return {'running'}
"""

# ARGV: token, status, body, ttl ms. Returns 1, or 0 when the token is not the holder's.
_COMPLETE = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'done', 'status', ARGV[2], 'body', ARGV[3])
redis.call('HDEL', KEYS[1], 'token')
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""

# ARGV: token.
_RELEASE = """
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisIdempotencyStore:
    """Entries under `keys.idempotency`; answers kept `ttl_s`, claims leased `lease_s`."""

    def __init__(self, redis: RedisClient, keys: KeySchema, ttl_s: float, lease_s: float):
        self._keys = keys
        self._ttl_ms = int(ttl_s * 1000)
        self._lease_ms = int(lease_s * 1000)
        self._claim = redis.register_script(_CLAIM)
        self._complete = redis.register_script(_COMPLETE)
        self._release = redis.register_script(_RELEASE)

    def _key(self, scope: str, key: str) -> str:
        return self._keys.idempotency(scope, key_hash(key))

    @translate_errors
    async def claim(self, scope: str, key: str, fingerprint: str) -> Outcome:
        token = secrets.token_hex(16)
        reply = await self._claim(
            keys=[self._key(scope, key)], args=[fingerprint, token, self._lease_ms]
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
        done = await self._complete(
            keys=[self._key(scope, key)],
            args=[token, answer.status, answer.body, self._ttl_ms],
        )
        return bool(done)

    @translate_errors
    async def release(self, scope: str, key: str, token: str) -> None:
        await self._release(keys=[self._key(scope, key)], args=[token])
