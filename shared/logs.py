"""Logging for every process: human lines, or with `IMROUTE_LOG_FORMAT=json` one JSON
object per line. Either way every line starts with (or holds, as `ts`) its time: UTC,
ISO 8601, to the millisecond.

A JSON line holds `ts` (UTC, ISO 8601, ms), `level`, `logger`, `message`, `process`
(push-service, gateway, ...), `pid`, and wherever they apply `push_id`, `msg_id`,
`batch_id` and `gateway_id`, plus `exc` for a traceback. The ids come from three places,
the first that has one winning:

- the record's own `extra={"batch_id": ...}` (a log call about one batch or gateway);
- the context a task is in (`log_context`, `bind`): a push binds its `push_id` and
  `msg_id` once, and every line logged while it runs, in any task it starts, has them;
- the process's own (`configure(static=...)`): a gateway's lines carry its id.
"""

from __future__ import annotations

import contextlib
import json
import logging
import logging.config
import os
import sys
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar, Token
from types import MappingProxyType
from typing import Any

__all__ = [
    "FIELDS",
    "JsonFormatter",
    "TextFormatter",
    "bind",
    "configure",
    "dict_config",
    "log_context",
    "say",
    "unbind",
]

FIELDS = ("push_id", "msg_id", "batch_id", "gateway_id")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class TextFormatter(logging.Formatter):
    """One human line per record, its time as JSON lines give it (UTC, ms)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _iso(record.created)


_NONE: Mapping[str, str] = MappingProxyType({})
_context: ContextVar[Mapping[str, str]] = ContextVar("imroute_log_context", default=_NONE)


def bind(**fields: str) -> Token[Mapping[str, str]]:
    """Add ids to the current context (and to the tasks it starts); `unbind` undoes it.
    For hot paths; elsewhere `log_context`."""
    return _context.set({**_context.get(), **fields})


def unbind(token: Token[Mapping[str, str]]) -> None:
    _context.reset(token)


@contextlib.contextmanager
def log_context(**fields: str) -> Iterator[None]:
    token = bind(**fields)
    try:
        yield
    finally:
        unbind(token)


class JsonFormatter(logging.Formatter):
    def __init__(self, process: str, static: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self._process = process
        self._static = dict(static or {})
        self._pid = os.getpid()

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "process": self._process,
            "pid": self._pid,
        }
        bound = _context.get()
        for name in FIELDS:
            value = record.__dict__.get(name) or bound.get(name) or self._static.get(name)
            if value:
                line[name] = str(value)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        # json (not orjson): a message may hold anything, a lone surrogate included.
        return json.dumps(line, ensure_ascii=False, default=str)


def _iso(created: float) -> str:
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def dict_config(
    level: str, fmt: str, process: str, static: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A `logging.config.dictConfig` for the root logger and uvicorn's, on stderr: one
    format for every line the process writes. Some libraries' own lines are held to
    warnings at any level: httpx logs each request's whole URL at INFO (a webhook's URL
    may carry its receiver's credentials: `user:pass@`, `?code=`), and websockets a line
    per connection closed (10,000 lines for a drain of 10,000 clients)."""
    if fmt == "json":
        formatter: dict[str, Any] = {
            "()": JsonFormatter,
            "process": process,
            "static": dict(static or {}),
        }
    else:
        formatter = {"()": TextFormatter}
    handler = {"class": "logging.StreamHandler", "formatter": "imroute", "stream": sys.stderr}
    level = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"imroute": formatter},
        "handlers": {"imroute": handler},
        "root": {"handlers": ["imroute"], "level": level},
        "loggers": {
            **{
                name: {"handlers": [], "level": level, "propagate": True}
                for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
            },
            **{
                name: {"handlers": [], "level": _at_least_warning(level), "propagate": True}
                for name in ("httpx", "httpcore", "websockets")
            },
        },
    }


def _at_least_warning(level: str) -> str:
    return level if logging.getLevelName(level) >= logging.WARNING else "WARNING"


def configure(level: str, fmt: str, process: str, static: Mapping[str, str] | None = None) -> None:
    """Log every record of this process at `level` and above, in `fmt` (text or json)."""
    logging.config.dictConfig(dict_config(level, fmt, process, static))


def say(
    text: str,
    fmt: str,
    process: str,
    static: Mapping[str, str] | None = None,
    err: bool = False,
    level: int = logging.INFO,
) -> None:
    """A line for people and scripts (a process ready, or why it stops), written
    whatever the log level: after its time, or with `fmt` json as one JSON line saying
    it."""
    if fmt == "json":
        record = logging.LogRecord(process, level, __file__, 0, text, None, None)
        text = JsonFormatter(process, static).format(record)
    else:
        text = f"{_iso(time.time())} {text}"
    print(text, file=sys.stderr if err else sys.stdout, flush=True)
