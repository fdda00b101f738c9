"""Idempotent pushes: one answer per (API key, Idempotency-Key), kept in Redis.

- `base`: the header's rules, the request fingerprint, the claim outcomes and which
  answers are kept; the IdempotencyStore seam.
- `store`: the entries in Redis, claimed and completed by Lua scripts
  (`RedisIdempotencyStore`);
- `http`: the Idempotency-Key on the push endpoints, as HTTP: claim, wait, replay, keep.
"""

# No re-exports: importing one module of the package loads only what it needs.
