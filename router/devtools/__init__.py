"""Running imroute on one machine: the dev stack, an embedded Redis, child processes, ports."""

from router.devtools.devstack import DevOptions, DevStack
from router.devtools.embedded_redis import EmbeddedRedis, find_redis_server, redis_answers
from router.devtools.ports import free_port, free_port_block, port_free
from router.devtools.procs import die_with_parent
from router.devtools.supervisor import Child, ChildExited, Supervisor, alive, descendants

__all__ = [
    "Child",
    "ChildExited",
    "DevOptions",
    "DevStack",
    "EmbeddedRedis",
    "Supervisor",
    "alive",
    "descendants",
    "die_with_parent",
    "find_redis_server",
    "free_port",
    "free_port_block",
    "port_free",
    "redis_answers",
]
