"""Execution listeners (Ribbon's ExecutionListener): observers of a balanced call.

A listener is for metrics, logs and traces: it cannot change the call's course, and one
that raises is logged and ignored, never allowed to fail the call it observes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from router.balancing.servers import GatewayState

__all__ = ["AttemptInfo", "ExecutionContext", "ExecutionListener", "Listeners"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ExecutionContext:
    """One execution (its first attempt and every retry); listeners may keep their own
    per-execution state in `attributes`."""

    key: str | None
    pinned: str | None  # the gateway id a P2P call must use; None: any gateway will do
    started: float  # monotonic seconds
    attempts: int = 0
    attributes: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    """One attempt: on which gateway, the how-manieth overall and on that gateway (from 1)."""

    server: GatewayState
    number: int
    number_on_server: int


class ExecutionListener(Protocol):
    def on_execution_start(self, ctx: ExecutionContext) -> None: ...
    def on_start_with_server(self, ctx: ExecutionContext, attempt: AttemptInfo) -> None: ...
    def on_exception_with_server(
        self, ctx: ExecutionContext, attempt: AttemptInfo, error: BaseException
    ) -> None: ...
    def on_execution_success(
        self, ctx: ExecutionContext, attempt: AttemptInfo, result: object
    ) -> None: ...
    def on_execution_failed(
        self, ctx: ExecutionContext, attempt: AttemptInfo | None, error: BaseException
    ) -> None: ...


class Listeners:
    """Calls every listener in order; an exception a listener raises is logged and dropped."""

    def __init__(self, listeners: Iterable[ExecutionListener] = ()) -> None:
        self._listeners = tuple(listeners)

    def __len__(self) -> int:
        return len(self._listeners)

    def on_execution_start(self, ctx: ExecutionContext) -> None:
        for listener in self._listeners:
            try:
                listener.on_execution_start(ctx)
            except Exception:
                _swallowed(listener, "on_execution_start")

    def on_start_with_server(self, ctx: ExecutionContext, attempt: AttemptInfo) -> None:
        for listener in self._listeners:
            try:
                listener.on_start_with_server(ctx, attempt)
            except Exception:
                _swallowed(listener, "on_start_with_server")

    def on_exception_with_server(
        self, ctx: ExecutionContext, attempt: AttemptInfo, error: BaseException
    ) -> None:
        for listener in self._listeners:
            try:
                listener.on_exception_with_server(ctx, attempt, error)
            except Exception:
                _swallowed(listener, "on_exception_with_server")

    def on_execution_success(
        self, ctx: ExecutionContext, attempt: AttemptInfo, result: object
    ) -> None:
        for listener in self._listeners:
            try:
                listener.on_execution_success(ctx, attempt, result)
            except Exception:
                _swallowed(listener, "on_execution_success")

    def on_execution_failed(
        self, ctx: ExecutionContext, attempt: AttemptInfo | None, error: BaseException
    ) -> None:
        for listener in self._listeners:
            try:
                listener.on_execution_failed(ctx, attempt, error)
            except Exception:
                _swallowed(listener, "on_execution_failed")


def _swallowed(listener: ExecutionListener, hook: str) -> None:
    # Exception, not BaseException: cancellation and KeyboardInterrupt still propagate.
    log.exception("execution listener %r failed in %s; ignored", listener, hook)
