"""Listeners: every listener hears every hook, in order; one that raises is logged and ignored."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from router.balancing import AttemptInfo, ExecutionContext, GatewayState, Listeners

SERVER = GatewayState("gw0", "g1", "ws://gw0/ws", "gw0:9000", 0, 100)


@dataclass
class Recorder:
    events: list[tuple[str, ...]] = field(default_factory=list)

    def on_execution_start(self, ctx: ExecutionContext) -> None:
        self.events.append(("start",))

    def on_start_with_server(self, ctx: ExecutionContext, attempt: AttemptInfo) -> None:
        self.events.append(("server", attempt.server.gateway_id, str(attempt.number)))

    def on_exception_with_server(
        self, ctx: ExecutionContext, attempt: AttemptInfo, error: BaseException
    ) -> None:
        self.events.append(("exception", attempt.server.gateway_id, type(error).__name__))

    def on_execution_success(
        self, ctx: ExecutionContext, attempt: AttemptInfo, result: object
    ) -> None:
        self.events.append(("success", attempt.server.gateway_id, str(result)))

    def on_execution_failed(
        self, ctx: ExecutionContext, attempt: AttemptInfo | None, error: BaseException
    ) -> None:
        where = attempt.server.gateway_id if attempt else "-"
        self.events.append(("failed", where, type(error).__name__))


class Raising:
    """A listener that raises in every hook."""

    def __init__(self) -> None:
        self.calls = 0

    def _boom(self, *args: object) -> None:
        self.calls += 1
        raise RuntimeError("listener bug")

    on_execution_start = _boom
    on_start_with_server = _boom
    on_exception_with_server = _boom
    on_execution_success = _boom
    on_execution_failed = _boom


def run(listeners: Listeners) -> None:
    """A call that fails once on gw0, then succeeds there, then a failed one."""
    ctx = ExecutionContext(key=None, pinned="gw0", started=0.0)
    listeners.on_execution_start(ctx)
    first, second = AttemptInfo(SERVER, 1, 1), AttemptInfo(SERVER, 2, 2)
    listeners.on_start_with_server(ctx, first)
    listeners.on_exception_with_server(ctx, first, ConnectionError())
    listeners.on_start_with_server(ctx, second)
    listeners.on_execution_success(ctx, second, "ok")
    listeners.on_execution_failed(ctx, None, TimeoutError())


def test_every_listener_hears_every_step_in_order() -> None:
    a, b = Recorder(), Recorder()
    run(Listeners([a, b]))
    expected = [
        ("start",),
        ("server", "gw0", "1"),
        ("exception", "gw0", "ConnectionError"),
        ("server", "gw0", "2"),
        ("success", "gw0", "ok"),
        ("failed", "-", "TimeoutError"),
    ]
    assert a.events == expected and b.events == expected


def test_a_raising_listener_is_logged_and_the_next_one_still_hears_everything(
    caplog: pytest.LogCaptureFixture,
) -> None:
    raising, recorder = Raising(), Recorder()
    with caplog.at_level(logging.ERROR, logger="router.balancing.listeners"):
        run(Listeners([raising, recorder]))
    assert raising.calls == 6
    assert len(recorder.events) == 6
    assert len(caplog.records) == 6 and "listener bug" in caplog.text
