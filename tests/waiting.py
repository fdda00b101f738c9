"""Waiting in tests: one poll loop, for conditions on what a test's servers and clients
have seen by now."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

__all__ = ["wait_for"]


async def wait_for(
    cond: Callable[[], object | Awaitable[object]],
    what: str,
    timeout: float = 5.0,
    *,
    every: float = 0.01,
    detail: Callable[[], str] | None = None,
) -> float:
    """Poll `cond` (a predicate, or an async one) every `every` seconds until it holds;
    the seconds that took. AssertionError naming `what` (and `detail()`, the state
    that explains it) once `timeout` has passed."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        held = cond()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return loop.time() - start
        if loop.time() - start > timeout:
            more = "" if detail is None else f"; {detail()}"
            raise AssertionError(f"timed out waiting for {what}{more}")
        await asyncio.sleep(every)
