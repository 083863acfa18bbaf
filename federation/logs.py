"""structlog set-up: JSON lines when not on a terminal (for log shippers), readable text on one."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import structlog


def _fallback(value: Any) -> Any:
    """What structlog's JSON renderer writes for a value JSON has no form for."""
    try:
        return value.__structlog__()
    except AttributeError:
        return repr(value)


# One encoder for every line. structlog's renderer calls `json.dumps` with a `default`, and
# `json.dumps` builds a new encoder at every such call: a tenth of a line's cost (every submission
# writes one, `job_submitted`). The same bytes either way (tests/unit/test_logs.py).
_ENCODE = json.JSONEncoder(default=_fallback).encode


def _dumps(event_dict: Any, **_dumps_kw: Any) -> str:
    return _ENCODE(event_dict)


class LineLogger(structlog.PrintLogger):
    """structlog's `PrintLogger` (its lock per file), each line written in one call and flushed.

    `print(..., flush=True)` writes the line and its newline apart, and stderr, line-buffered,
    passes each on at once: two writes and a flush a line where one write does."""

    def msg(self, message: str) -> None:
        with self._lock:
            self._file.write(message + "\n")
            self._file.flush()

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def configure_logging(*, level: str = "info", json: bool | None = None) -> None:
    use_json = (not sys.stderr.isatty()) if json is None else json
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer(serializer=_dumps)
        if use_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    stderr = sys.stderr
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=lambda *_args: LineLogger(stderr),
        cache_logger_on_first_use=True,
    )
