"""A start-up that never reaches its first iteration does not hang unseen.

Start-up runs in named phases (`phase`), each logged with its duration when it ends. A
watchdog thread waits for `started()` (the first iteration's end); when `timeout_s` passes
first, it logs the phase the process is in, how long it has been starting, and every
thread's Python stack, then ends the process with `EXIT_STARTUP_TIMEOUT`, so that a
supervisor (systemd's Restart=on-failure) starts it again. Nothing has been trained at that
point, so there is nothing to save. systemd's own TimeoutStartSec would only send SIGTERM
to a process that may be stuck where a signal cannot reach it, with no trace of where.

The stacks are read with `sys._current_frames()` from this thread, with the GIL held: the
other threads' frames stand still while they are read (runtime/signals.py says why
faulthandler's C-level dump from a signal handler is not safe here).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator

import structlog

log = structlog.get_logger("startup")

# sysexits' EX_SOFTWARE: not a bad config (78) or bad data (65), so systemd restarts it.
EXIT_STARTUP_TIMEOUT = 70


def thread_stacks() -> dict[str, str]:
    """Every thread's Python stack, innermost call last, by thread name and id."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return {
        f"{names.get(ident, 'unknown')} ({ident})": "".join(traceback.format_stack(frame))
        for ident, frame in sys._current_frames().items()
    }


def _exit_process(code: int) -> None:
    """The main thread may be blocked anywhere (a C call, a lock): only _exit ends it."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a stream without a reader must not stop the exit
            stream.flush()
    os._exit(code)


class StartupWatchdog:
    """`timeout_s` seconds from `start()` to `started()`, or the process ends (0: no limit,
    the phases are still logged)."""

    def __init__(
        self,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_timeout: Callable[[int], None] = _exit_process,
    ) -> None:
        self.timeout_s = timeout_s
        self.current = "starting"
        self._clock = clock
        self._on_timeout = on_timeout
        self._began = clock()
        self._entered: float | None = None  # clock() when `enter` named the current phase
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> StartupWatchdog:
        if self.timeout_s > 0 and self._thread is None:
            self._thread = threading.Thread(
                target=self._watch, name="startup-watchdog", daemon=True
            )
            self._thread.start()
        return self

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A named part of start-up; logged with its seconds when it ends."""
        before, self.current = self.current, name
        t0 = self._clock()
        try:
            yield
        finally:
            log.info("start-up phase", phase=name, seconds=round(self._clock() - t0, 3))
            self.current = before

    def enter(self, name: str) -> None:
        """From now on start-up is in phase `name` (one with no end of its own: the first
        iteration, which `started()` ends)."""
        self.current = name
        self._entered = self._clock()

    def started(self) -> None:
        """The first iteration has ended: start-up is over (later calls do nothing)."""
        if self._done.is_set():
            return
        self._done.set()
        now = self._clock()
        if self._entered is not None:
            log.info("start-up phase", phase=self.current, seconds=round(now - self._entered, 3))
        log.info("started", seconds=round(now - self._began, 3))

    def close(self) -> None:
        """Stop watching (the process is stopping, started or not)."""
        self._done.set()

    def _watch(self) -> None:
        if self._done.wait(self.timeout_s):
            return
        log.error(
            "start-up timed out: no iteration finished",
            phase=self.current,
            seconds=round(self._clock() - self._began, 1),
            timeout_s=self.timeout_s,
            exit_code=EXIT_STARTUP_TIMEOUT,
            fix="see where each thread is below; raise run.startup_timeout_s if start-up is "
            "only slow (0 turns the limit off)",
            stacks=thread_stacks(),
        )
        self._on_timeout(EXIT_STARTUP_TIMEOUT)
