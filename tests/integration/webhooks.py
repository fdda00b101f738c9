"""What the webhook tests share: a push service's webhook settings, events, its counters."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from router.webhook.base import Event
from tests.integration.procs import service_env
from tests.integration.stack import AUTH

__all__ = ["HOOK_SECRET", "env_for", "metrics", "metrics_once", "unacked"]

HOOK_SECRET = "whsec-test-0123456789"


def env_for(redis_url: str, prefix: str, tmp_path: Path, url: str, **extra: str) -> dict[str, str]:
    return service_env(
        redis_url,
        prefix,
        tmp_path,
        IMROUTE_WEBHOOK_URL=url,
        IMROUTE_WEBHOOK_SECRET=HOOK_SECRET,
        IMROUTE_WEBHOOK_BACKOFF_MAX_S="0.3",
        IMROUTE_WEBHOOK_TIMEOUT_S="2",
        **extra,
    )


def unacked(n: int, start: int = 0) -> list[Event]:
    """Events shaped like the push service's message.unacked."""
    now = int(time.time() * 1000)
    return [
        Event(
            "message.unacked",
            f"message.unacked:p{i}",
            now,
            {"push_id": f"p{i}", "msg_id": f"m{i}", "uids": [f"u{i}"], "preview": "hi"},
        )
        for i in range(start, start + n)
    ]


async def metrics(port: int) -> dict[str, float]:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics", headers=AUTH)).text
    values = {}
    for line in text.splitlines():
        if line.startswith("imroute_webhook_"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


async def metrics_once(port: int, name: str, value: float) -> dict[str, float]:
    """The metrics once `name` reads `value` (counters move just after the answer)."""
    deadline = time.monotonic() + 10
    while (counts := await metrics(port)).get(name) != value:
        assert time.monotonic() < deadline, (name, value, counts)
        await asyncio.sleep(0.05)
    return counts
