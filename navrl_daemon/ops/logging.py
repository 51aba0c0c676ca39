"""structlog set-up: JSON lines for journald when stderr is not a TTY; on a TTY colours,
progress summaries as tables and lines kept off the progress bar (ops/console.py)."""

from __future__ import annotations

import logging
import shutil
import threading
from typing import Any

import structlog

from navrl_daemon.config import LogConfig
from navrl_daemon.ops.console import BarAwareStderr, ProgressTableRenderer
from navrl_daemon.ops.log_stream import LogStream

# Fields every line of this process carries, from any thread (the rank of a distributed
# run); contextvars would not reach threads that were started before they were bound.
_PROCESS_FIELDS: dict[str, Any] = {}


def bind_process_fields(**fields: Any) -> None:
    _PROCESS_FIELDS.update(fields)


def _add_process_fields(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
    for key, value in _PROCESS_FIELDS.items():
        event.setdefault(key, value)
    return event


class FirstError:
    """An error that holds once it happens (a CUDA graph capture that fell back stays
    fallen back), logged the first time `check` sees it, not at every check."""

    def __init__(self, logger: Any, event: str) -> None:
        self.logger = logger
        self.event = event
        self.logged = False

    def check(self, error: str | None) -> None:
        if error and not self.logged:
            self.logged = True
            self.logger.error(self.event, error=error)


def configure_logging(cfg: LogConfig, *, stream: Any = None) -> LogStream:
    """Lines to `stream` (default: stderr, kept clear of a progress bar) through a
    `LogStream`, which outlives the stream's reader (ops/log_stream.py); returned, for
    `run` to name the file the log goes on in."""
    stream = LogStream(stream or BarAwareStderr())
    fmt = cfg.format
    if fmt == "auto":
        fmt = "console" if _isatty(stream) else "json"
    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        tty = _isatty(stream)
        renderer = ProgressTableRenderer(
            structlog.dev.ConsoleRenderer(colors=tty),
            width=(lambda: shutil.get_terminal_size().columns) if tty else None,
        )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            _add_process_fields,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[cfg.level.upper()]
        ),
        # One write per line (message and newline together): ranks of a distributed run
        # share the launcher's stderr, and a pipe keeps writes under PIPE_BUF whole.
        logger_factory=structlog.WriteLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    # An exception that ends a thread (a library's writer thread, say) is one log line like
    # every other, not a traceback that breaks the JSON stream journald and tests read.
    threading.excepthook = _log_thread_exception
    return stream


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    structlog.get_logger("thread").error(
        "uncaught exception in a thread",
        thread=args.thread.name if args.thread is not None else None,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
