"""Child processes that never outlive the process that started them."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Callable

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1


def _find_prctl() -> Callable[..., int] | None:
    with contextlib.suppress(OSError, AttributeError):
        prctl: Callable[..., int] = ctypes.CDLL("libc.so.6", use_errno=True).prctl
        return prctl
    return None


# Resolved here, in the parent: the forked child then loads no library (no loader lock).
_PRCTL = _find_prctl()


def die_with_parent() -> None:
    """A `preexec_fn`: the child gets SIGTERM when its parent dies, even by SIGKILL (Linux)."""
    parent = os.getppid()
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)
    # The parent may have died before prctl took effect: then nobody would signal us.
    if os.getppid() != parent:
        os._exit(1)
