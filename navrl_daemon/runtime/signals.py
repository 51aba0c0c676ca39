"""SIGINT, SIGTERM and SIGHUP mean "stop", from the first line of `main` to the process's end.

What a stop signal does depends on how far the process has come:

- **starting** (from `install()`, while modules load, the config is read, the state dir
  locked): `StopRequested` is raised in the main thread, like KeyboardInterrupt. Nothing
  has been trained, so start-up is abandoned and the command exits 0. (Commands other
  than `run` and `launch` stay in this phase: a stop ends them with 0 too.) Python drops
  an exception raised where it cannot propagate (a weakref callback of the import
  machinery, a `__del__`), so the stop is also remembered, and `queued()` raises it again
  before the event loop starts: a stop is never lost. Python's "Exception ignored in ..."
  traceback for the dropped one is not printed (`sys.unraisablehook`). A stop that lands
  in Python code that C code runs during an import (torch's C++ start-up calls back into
  Python) is not raised there, where unwinding C++ frames aborts the process: it is sent
  again a moment later, or raised by `queued()`.
- **queued** (inside `queued()`, i.e. while the event loop runs): the signal is queued and
  the supervisor takes it from `next()`. The first stops the pipeline cleanly (final
  checkpoint, export), a second aborts the work in flight. One that arrives while the
  stages are still being built stops them as soon as they start.
- **finished** (after `queued()`): ignored; everything is saved, the process is only exiting.

SIGHUP (a closed terminal, a dropped ssh session) is a stop like SIGTERM: the daemon has no
configuration to reload.

SIGUSR2 is not a stop: `dump_stacks_on` makes it write every thread's traceback to stderr.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import faulthandler
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

import anyio

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STDERR_FD = 2  # fd 2 itself (the journal under systemd)
RETRY_S = 0.05  # a stop that arrived inside an import is sent again after this long
IMPORT_FRAMES = "<frozen importlib._bootstrap"  # importlib's own frames' file names


def _inside_import(frame: FrameType | None) -> bool:
    """Whether Python code is running an import somewhere up this frame's stack."""
    while frame is not None:
        if frame.f_code.co_filename.startswith(IMPORT_FRAMES):
            return True
        frame = frame.f_back
    return False


def dump_stacks_on(sig: signal.Signals) -> None:
    """From now on `sig` writes every thread's Python traceback to stderr, in faulthandler's
    format, and the process goes on (main thread only).

    Not `faulthandler.register`: its handler runs at the C level, in whichever thread the
    signal lands on, and walks the other threads' frames while they run, so a thread that
    pushes or pops a frame meanwhile can leave it reading freed memory (a dump just before
    one crash showed line 1193655264 of an asyncio function): the daemon died of SIGSEGV
    in 5 dumps of 40 under load (tests/test_daemon_signals.py). A Python-level handler
    runs on the main thread with the GIL held, when every other thread is parked outside
    the interpreter, so their frames stand still while they are read. The cost: the dump
    waits for the main thread's next bytecode. A blocking system call there returns early
    for it when the signal lands on the main thread (EINTR, PEP 475); one that lands on
    another thread wakes the event loop through the wakeup fd that `StopSignals` sets. Only
    one long C call holding the GIL would delay it."""
    signal.signal(sig, _dump_stacks)


def _dump_stacks(signum: int, frame: FrameType | None) -> None:
    faulthandler.dump_traceback(file=STDERR_FD, all_threads=True)


class StopRequested(BaseException):
    """A stop signal during start-up. A BaseException, like KeyboardInterrupt, so that no
    `except Exception` on the way turns it into an error."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


class Phase(enum.Enum):
    IDLE = "idle"  # not installed
    STARTING = "starting"
    QUEUED = "queued"
    FINISHED = "finished"


class StopSignals:
    def __init__(self, signals: Sequence[signal.Signals] = STOP_SIGNALS) -> None:
        self.signals = tuple(signals)
        self.phase = Phase.IDLE
        self.received: list[str] = []  # every stop signal's name since install(), in order
        self._previous_unraisable = sys.unraisablehook
        self._queue: collections.deque[str] = collections.deque()
        self._previous: dict[signal.Signals, Any] = {}
        self._previous_wakeup_fd = -1
        self._retrying: int | None = None  # a stop deferred out of an import, sent again
        # A waiting next() wakes up through this pair: Python's C-level handler writes to it
        # (set_wakeup_fd) even when the signal lands on a compute thread while the event
        # loop sleeps, and `_handle` then runs on the main thread.
        self._wake_r, self._wake_w = socket.socketpair()
        for sock in (self._wake_r, self._wake_w):
            sock.setblocking(False)

    def install(self) -> StopSignals:
        """Handle the stop signals from now on (main thread only); returns self."""
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        self._previous_wakeup_fd = signal.set_wakeup_fd(
            self._wake_w.fileno(), warn_on_full_buffer=False
        )
        self._previous_unraisable = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        self.received.clear()
        self.phase = Phase.STARTING
        return self

    def _unraisable(self, unraisable: Any) -> None:
        """A StopRequested that Python had to drop is remembered (`received`), not an error
        to print; anything else goes to the hook before ours."""
        if not isinstance(unraisable.exc_value, StopRequested):
            self._previous_unraisable(unraisable)

    @contextlib.contextmanager
    def queued(self) -> Iterator[None]:
        """While inside, signals are queued for `next()` (the event loop's turn); after it,
        they are ignored until the process ends. Raises `StopRequested` instead of entering
        if a stop arrived while starting (one whose exception was swallowed on its way)."""
        if self.phase is Phase.STARTING and self.received:  # each one arrived while starting
            raise StopRequested(self.received[0])
        self.phase = Phase.QUEUED
        try:
            yield
        finally:
            self.finish()

    def finish(self) -> None:
        """Ignore the stop signals from now on: the process is only exiting. SIG_IGN rather
        than a handler, so that it holds while the interpreter shuts down too."""
        if self.phase in (Phase.IDLE, Phase.FINISHED):
            return
        self.phase = Phase.FINISHED
        for sig in self.signals:
            signal.signal(sig, signal.SIG_IGN)
        self._close_wake_pair()

    def restore(self) -> None:
        """Put back the handlers `install` replaced (for callers that live on: tests)."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        if sys.unraisablehook == self._unraisable:
            sys.unraisablehook = self._previous_unraisable
        self.phase = Phase.IDLE
        self._close_wake_pair()

    def _close_wake_pair(self) -> None:
        # Unhook it first: a closed fd number may be reused by a file signals must not reach.
        if signal.set_wakeup_fd(-1) == self._wake_w.fileno() and self._previous_wakeup_fd >= 0:
            signal.set_wakeup_fd(self._previous_wakeup_fd)
        self._previous_wakeup_fd = -1
        self._wake_r.close()
        self._wake_w.close()

    async def next(self) -> str:
        """The next queued stop signal's name (SIGTERM, ...); waits for one."""
        while not self._queue:
            await anyio.wait_readable(self._wake_r)
            with contextlib.suppress(BlockingIOError):
                while self._wake_r.recv(512):
                    pass
        return self._queue.popleft()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._retrying == signum:  # our own repeat of a stop that arrived in an import
            self._retrying = None
        else:
            self.received.append(name)
        if self.phase is Phase.STARTING:
            if _inside_import(frame):
                # C code running an import calls back into Python (torch's C++ start-up
                # does): raised here, the exception would unwind through C++ frames, which
                # abort the process (rc 134). Ask again shortly, out of the import by then
                # or at `queued()`, which raises it at a Python boundary.
                self._repeat_later(signum)
                return
            raise StopRequested(name)
        if self.phase is Phase.QUEUED:
            self._deliver(name)

    def _send_again(self, signum: int) -> None:
        if self._retrying == signum and self.phase is Phase.STARTING:  # not handled since
            os.kill(os.getpid(), signum)

    def _repeat_later(self, signum: int) -> None:
        self._retrying = signum
        timer = threading.Timer(RETRY_S, self._send_again, (signum,))
        timer.daemon = True
        timer.start()

    def _deliver(self, name: str) -> None:
        self._queue.append(name)
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"\0")
