"""structlog set-up: JSON lines for journald when stderr is not a TTY, colours when it is."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from navrl_daemon.config import LogConfig


class _CurrentStderr:
    """Whatever `sys.stderr` is when a line is written, not when logging was set up (a
    test harness or a caller may swap it and close the old one)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return _isatty(sys.stderr)


def configure_logging(cfg: LogConfig, *, stream: Any = None) -> None:
    stream = stream or _CurrentStderr()
    fmt = cfg.format
    if fmt == "auto":
        fmt = "console" if _isatty(stream) else "json"
    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=_isatty(stream))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[cfg.level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
