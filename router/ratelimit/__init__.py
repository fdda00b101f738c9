"""Rate limits shared by every push-service process: a GCRA in one Redis script."""

from router.ratelimit.base import RateLimit, RateLimiter
from router.ratelimit.store import RedisRateLimiter

__all__ = ["RateLimit", "RateLimiter", "RedisRateLimiter"]
