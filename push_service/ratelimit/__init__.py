"""Rate limits shared by every push-service process, per API key.

- `base`: the limit (`RateLimit`, parsed from IMROUTE_RATE_LIMIT) and the RateLimiter seam.
- `store`: a GCRA in one Redis script (`RedisRateLimiter`, `gcra.lua`).

The gate on the sending endpoints (429 from the headers alone) is
`push_service.admission`'s.
"""

# No re-exports: importing one module of the package loads only what it needs.
