"""Throttled log lines: for refusals an attacker can repeat at will, losses that come
in bursts, a loop that fails every second. Each occurrence is counted, and a log line
goes out at most once per `every_s`, saying how many happened since the previous one,
so a flood never becomes a flood of log lines.

`Throttled` is the count (pure: time is passed in, monotonic seconds); `ThrottledLine`
is the log line on it, which also says what a window held back when the window ends.
A loop's failures (`shared.periodic`) and a filter of another library's lines
(`push_service.head_limits.ParseErrorLines`) keep the count alone: the loop's next
failure says what it held back, and a filter has no line of its own to say it with.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Throttled", "ThrottledLine", "say_held"]


@dataclass(slots=True)
class Throttled:
    """Counts occurrences of one kind and lets a log line through at most once per
    `every_s`, reporting how many happened since the previous line."""

    every_s: float = 10.0
    total: int = 0
    _unlogged: int = 0
    _line_at: float | None = None

    def note(self, now: float, n: int = 1) -> int:
        """Count `n` occurrences at `now`; the number to log (since the last line, these
        included) if a line is due, else 0."""
        self.total += n
        self._unlogged += n
        last = self._line_at
        if last is not None and now - last < self.every_s:
            return 0
        since, self._unlogged = self._unlogged, 0
        self._line_at = now
        return since

    def due_in(self, now: float) -> float | None:
        """Seconds until what was held back since the last line may be said (0: now);
        None when nothing is held back."""
        if not self._unlogged:
            return None
        last = self._line_at
        return 0.0 if last is None else max(0.0, last + self.every_s - now)

    def take_held(self) -> int:
        """What was held back since the last line, at once, window or not (a process
        that stops says it before it goes)."""
        since, self._unlogged = self._unlogged, 0
        return since

    def flush(self, now: float) -> int:
        """What was held back since the last line, once its window has passed (a line
        that says it is then due, as `note` would let one through); else 0. For a timer
        at the window's end, so that a burst that stops is said whole."""
        if self.due_in(now) != 0.0:
            return 0
        since, self._unlogged = self._unlogged, 0
        self._line_at = now
        return since


class ThrottledLine:
    """One log line for something others can repeat at will (refusals, losses): each
    occurrence counted, a line at most once per `every_s` saying how many since the
    last (`Throttled`), and what a window held back said when it ends, by a timer on
    the running loop, so that a burst that stops is said whole.

    `msg` is a %-format over a mapping: `%(n)d` is the occurrences since the last line,
    `%(total)d` all of them, and the rest are the fields `note` is given (a line said
    at a window's end carries those of the last occurrence). `now` is the monotonic
    clock the window is measured on."""

    def __init__(
        self,
        log: logging.Logger,
        msg: str,
        *,
        level: int = logging.WARNING,
        every_s: float = 10.0,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.count = Throttled(every_s)
        self._log = log
        self._msg = msg
        self._level = level
        self._now = now
        self._held: tuple[dict[str, object], BaseException | None] = ({}, None)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None
        _LINES.add(self)

    @property
    def total(self) -> int:
        """Occurrences noted in all."""
        return self.count.total

    def note(self, n: int = 1, *, exc_info: BaseException | None = None, **fields: object) -> None:
        """Count `n` occurrences; the line now if one is due, else at the window's end
        (`exc_info`: a traceback for the line)."""
        now = self._now()
        if since := self.count.note(now, n):
            self._held = ({}, None)  # said: nothing of an earlier one is kept alive
            self._say(since, fields, exc_info)
            return
        self._held = (fields, exc_info)
        self._later(now)

    def _say(self, since: int, fields: dict[str, object], exc_info: BaseException | None) -> None:
        args = {"n": since, "total": self.count.total, **fields}
        self._log.log(self._level, self._msg, args, exc_info=exc_info)

    def _later(self, now: float) -> None:
        due = self.count.due_in(now)
        if due is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a caller in a thread): said by the next line
            return
        if self._timer is not None and self._timer_loop is loop:
            return
        # None, or one on a loop that is gone (closed before it fired): never to fire.
        # In a context of its own: the line speaks for many occurrences, not for the one
        # whose context (its push's bound ids, `shared.logs.bind`) armed the timer.
        self._timer = loop.call_later(due, self._due, context=contextvars.Context())
        self._timer_loop = loop

    def _due(self) -> None:
        self._timer = None
        now = self._now()
        if since := self.count.flush(now):
            (fields, exc_info), self._held = self._held, ({}, None)
            self._say(since, fields, exc_info)
        else:  # a clock behind the loop's: wait for it
            self._later(now)

    def say_held(self) -> None:
        """Say what this line holds back now (see `say_held`)."""
        if self._timer is not None:
            if self._timer_loop is _running_loop():  # a handle is its own loop's to cancel
                self._timer.cancel()
            self._timer = None
        if since := self.count.take_held():
            (fields, exc_info), self._held = self._held, ({}, None)
            self._say(since, fields, exc_info)


# Every line of the process, for `say_held`.
_LINES: weakref.WeakSet[ThrottledLine] = weakref.WeakSet()


def say_held() -> None:
    """Say what every line of this process holds back: for a process that stops, once
    its parts have closed (their last losses noted), since no window's end will come."""
    for line in list(_LINES):
        line.say_held()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
