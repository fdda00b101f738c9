"""Code the docs give their readers to copy, taken from the page, so tests run what they read."""

from __future__ import annotations

import functools
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

__all__ = ["python_block", "webhook_verified"]

WEBHOOKS = Path(__file__).resolve().parent.parent / "docs" / "guides" / "webhooks.md"


@functools.cache
def python_block(after: str, page: Path = WEBHOOKS) -> str:
    """The first ```python block of `page` after its first line holding `after`, dedented."""
    lines = page.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if after in line)
    opening = next(i for i in range(start, len(lines)) if lines[i].strip() == "```python")
    closing = next(i for i in range(opening + 1, len(lines)) if lines[i].strip() == "```")
    return textwrap.dedent("\n".join(lines[opening + 1 : closing])) + "\n"


def webhook_verified(
    clock: Callable[[], float] = time.time,
) -> Callable[..., bool]:
    """The webhooks page's receiver check (its `verified`), reading time from `clock`."""
    space: dict[str, Any] = {}
    exec(compile(python_block("**The signature**"), str(WEBHOOKS), "exec"), space)
    space["time"] = SimpleNamespace(time=clock)
    verified: Callable[..., bool] = space["verified"]  # (secret, body, header[, tolerance_s])
    return verified
