"""What Redis did during a measurement: INFO deltas of its CPU, commands and reads.

Every figure counts the whole server, so it is this run's alone only when nothing else
uses that Redis (a private redis-server; see docs/benchmarks/index.md). `reads` is INFO's
`total_reads_processed`: socket reads, about one per round trip (a pipeline is one),
where `commands` counts each command, those a script runs included.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import redis

__all__ = ["RedisCounters", "redis_counters"]


@dataclass
class RedisCounters:
    cpu_s: float = 0.0  # used_cpu_user + used_cpu_sys
    commands: int = 0  # total_commands_processed
    reads: int = 0  # total_reads_processed
    calls: dict[str, int] = field(default_factory=dict)  # commandstats: cmd -> calls

    def minus(self, before: RedisCounters) -> RedisCounters:
        calls = {
            name: n - before.calls.get(name, 0)
            for name, n in self.calls.items()
            if n != before.calls.get(name, 0)
        }
        return RedisCounters(
            self.cpu_s - before.cpu_s,
            self.commands - before.commands,
            self.reads - before.reads,
            dict(sorted(calls.items(), key=lambda kv: -kv[1])),
        )

    def per(self, n: int) -> dict[str, object]:
        """The figures divided by `n` (pushes), CPU in ms."""
        if n <= 0:
            return {}
        return {
            "cpu_ms": 1000 * self.cpu_s / n,
            "commands": self.commands / n,
            "reads": self.reads / n,
            "calls": {name: calls / n for name, calls in self.calls.items()},
        }


def redis_counters(url: str) -> RedisCounters | None:
    """The server's counters now; None when it does not answer INFO."""
    with contextlib.suppress(redis.RedisError, OSError, KeyError, ValueError):
        client = redis.Redis.from_url(url, socket_timeout=5)
        try:
            cpu = client.info("cpu")
            stats = client.info("stats")
            commandstats = client.info("commandstats")
        finally:
            client.close()
        return RedisCounters(
            float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
            int(stats["total_commands_processed"]),
            int(stats.get("total_reads_processed", 0)),
            {
                name.removeprefix("cmdstat_"): int(v["calls"])
                for name, v in commandstats.items()
                if isinstance(v, dict)
            },
        )
    return None
