"""Open-loop REST load: POST /v1/push bodies on a schedule, over several keep-alive pools."""

from __future__ import annotations

import asyncio
import importlib.util
import math
import sys
import time
from collections.abc import Sequence
from typing import Protocol, TypeVar

import httpx

__all__ = ["Timed", "make_clients", "run_load", "skip_missing_sniffio"]

CONNS_PER_CLIENT = 4  # keep-alive connections per httpx.AsyncClient


class Timed(Protocol):
    """One push of the schedule: when it was due, sent and answered (monotonic seconds)."""

    due: float
    sent: float
    answered: float

    def answer(self, resp: httpx.Response) -> None:
        """Record what the push service answered."""

    def fail(self, exc: Exception) -> None:
        """Record why the call failed."""


R = TypeVar("R", bound=Timed)


def make_clients(base_url: str, api_key: str, concurrency: int) -> list[httpx.AsyncClient]:
    """Several small keep-alive pools rather than one big one.

    httpcore's pool scans every connection for every queued request, so one client
    with 64 connections costs the load generator about twice the CPU per request of
    sixteen clients with four connections each (measured on the P2P bench).
    """
    count = math.ceil(concurrency / CONNS_PER_CLIENT)
    per = math.ceil(concurrency / count)
    return [
        httpx.AsyncClient(
            base_url=base_url,
            headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
            limits=httpx.Limits(max_connections=per, max_keepalive_connections=per),
            timeout=httpx.Timeout(10.0),
            trust_env=False,
        )
        for _ in range(count)
    ]


def skip_missing_sniffio() -> None:
    """Make httpcore's per-request `import sniffio` fail fast when sniffio is not installed.

    httpcore 1.0 imports sniffio inside `current_async_library()`, several times per
    request; without sniffio each attempt is a failed import that walks sys.path, which
    cost the load generator about 0.5 ms per request. A None entry in sys.modules makes
    the import fail at once, with the same outcome (httpcore then assumes asyncio).
    """
    if importlib.util.find_spec("sniffio") is None:
        sys.modules["sniffio"] = None  # type: ignore[assignment]


async def _push(
    slots: asyncio.Queue[httpx.AsyncClient], client: httpx.AsyncClient, body: bytes, rec: Timed
) -> None:
    try:
        rec.sent = time.monotonic()
        resp = await client.post("/v1/push", content=body)
        rec.answered = time.monotonic()
        rec.answer(resp)
    except Exception as exc:  # any failure is a result to count, not a reason to stop
        rec.answered = time.monotonic()
        rec.fail(exc)
    finally:
        slots.put_nowait(client)


async def _slot_freed(slots: asyncio.Queue[httpx.AsyncClient]) -> None:
    slots.put_nowait(await slots.get())


async def run_load(
    clients: list[httpx.AsyncClient],
    records: Sequence[R],
    bodies: Sequence[bytes],
    rate: float,
    concurrency: int,
    cutoff_s: float,
) -> int:
    """Open loop: push i is due at t0 + i/rate whatever happened to earlier pushes; returns
    how many were sent.

    At most `concurrency` calls are in flight (spread evenly over the clients' pools);
    when that many are outstanding the schedule slips, which the send lag shows. Pushes
    still unsent `cutoff_s` after the start are not sent at all (their `sent` stays nan),
    so an overloaded run ends in bounded time.
    """
    slots: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
    for j in range(concurrency):
        slots.put_nowait(clients[j % len(clients)])
    tasks: set[asyncio.Task[None]] = set()
    t0 = time.monotonic() + 0.05
    stop_at = t0 + cutoff_s
    i = 0
    n = len(records)
    while i < n and time.monotonic() < stop_at:
        now = time.monotonic()
        due = t0 + i / rate
        if due > now:
            await asyncio.sleep(due - now)
            continue
        # Everything that is due now goes out now (timers are coarser than 1/rate).
        while i < n and t0 + i / rate <= (now := time.monotonic()) < stop_at:
            if slots.empty():  # `concurrency` calls in flight: wait for one to end
                try:
                    await asyncio.wait_for(_slot_freed(slots), max(0.001, stop_at - now))
                except TimeoutError:
                    break
            client = slots.get_nowait()
            records[i].due = t0 + i / rate
            task = asyncio.create_task(_push(slots, client, bodies[i], records[i]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
    if tasks:
        await asyncio.wait(tasks, timeout=30)
    for task in tasks:
        task.cancel()
    return i
