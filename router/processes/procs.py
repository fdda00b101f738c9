"""Child processes that never outlive the process that started them."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Callable

__all__ = ["STOP_SIGNALS", "die_with_parent", "hold_stop_signals", "take_stop_signals"]

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


# What a supervisor stops its children with (`router.processes.supervisor`).
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


def hold_stop_signals() -> None:
    """A `preexec_fn` (after `die_with_parent`): the child starts with STOP_SIGNALS
    blocked, as a blocked mask outlives exec. One sent while it starts (imports, its
    app's set-up) is held until it can handle it (`take_stop_signals`), not lost: Python
    raises a SIGINT's KeyboardInterrupt where it lands, and one that lands in a
    finalizer or a callback is printed and dropped, the child then running on (the
    likeliest cause of a replacement worker that ran on after a stop)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def take_stop_signals() -> None:
    """Unblock STOP_SIGNALS (`hold_stop_signals`), once their handlers are in place: one
    held meanwhile is handled now. Harmless in a process that did not hold them."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
