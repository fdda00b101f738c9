"""Running imroute on one machine: the dev stack, an embedded Redis, child processes."""

from router.devtools.devstack import DevOptions, DevStack
from router.devtools.embedded_redis import EmbeddedRedis, find_redis_server, redis_answers
from router.devtools.procs import die_with_parent

__all__ = [
    "DevOptions",
    "DevStack",
    "EmbeddedRedis",
    "die_with_parent",
    "find_redis_server",
    "redis_answers",
]
