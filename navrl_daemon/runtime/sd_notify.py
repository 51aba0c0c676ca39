"""systemd's notify protocol, written straight to `$NOTIFY_SOCKET` (no libsystemd).

One datagram per call, `KEY=VALUE` lines (see sd_notify(3)). Outside systemd, or when the
socket is gone, every call is a no-op that returns False: notification is best effort and
must never take the daemon down.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping

import anyio


class SystemdNotifier:
    """Sends READY/STATUS/WATCHDOG/STOPPING/EXTEND_TIMEOUT_USEC to the service manager."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._address = _socket_address(env.get("NOTIFY_SOCKET", ""))
        self._sock: socket.socket | None = None
        if self._address is not None:
            try:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            except OSError:
                self._sock = None
            else:
                # A manager that stops reading must not stall the event loop: drop instead.
                self._sock.setblocking(False)
        self.enabled: bool = self._sock is not None
        self.watchdog_interval: float | None = _watchdog_interval(env) if self.enabled else None

    def notify(self, **fields: str | int) -> bool:
        """Send all fields in one datagram; False if disabled or the send failed."""
        if self._sock is None or self._address is None or not fields:
            return False
        message = "\n".join(f"{key}={_one_line(value)}" for key, value in fields.items())
        try:
            self._sock.sendto(message.encode(), self._address)
        except OSError:
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        if status is None:
            return self.notify(READY=1)
        return self.notify(READY=1, STATUS=status)

    def status(self, text: str) -> bool:
        return self.notify(STATUS=text)

    def watchdog(self) -> bool:
        return self.notify(WATCHDOG=1)

    def stopping(self, status: str | None = None) -> bool:
        if status is None:
            return self.notify(STOPPING=1)
        return self.notify(STOPPING=1, STATUS=status)

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for `seconds` more before systemd's start/stop timeout fires; re-send to go on."""
        return self.notify(EXTEND_TIMEOUT_USEC=max(0, int(seconds * 1_000_000)))

    def close(self) -> None:
        """Close the socket; later calls return False. Idempotent."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self.enabled = False


class ProgressWatchdog:
    """Sends WATCHDOG=1 at notifier.watchdog_interval only while progress() has been called
    since the last ping (so a stalled daemon stops pinging and systemd kills it).

    systemd kills the service after WATCHDOG_USEC without a ping, so one unit of progress must
    take less than half of it; set `WatchdogSec=` above twice the slowest iteration.
    """

    def __init__(
        self, notifier: SystemdNotifier, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._notifier = notifier
        self._clock = clock
        # progress() may run in a worker thread: it only bumps a counter the loop compares.
        self._progress_count = 0
        self._pinged_count = 0
        self.last_progress_at: float | None = None  # clock() of the latest progress()

    def progress(self) -> None:
        """Call after each training iteration."""
        self._progress_count += 1
        self.last_progress_at = self._clock()

    async def run(self) -> None:
        """Ping every interval while progress is seen; return at once if there is no watchdog."""
        interval = self._notifier.watchdog_interval
        if interval is None:
            return
        while True:
            await anyio.sleep(interval)
            seen = self._progress_count
            if seen != self._pinged_count:
                self._pinged_count = seen
                self._notifier.watchdog()


def _socket_address(value: str) -> str | None:
    """`@name` is an abstract socket (leading NUL); anything else non-empty is a path."""
    if not value:
        return None
    if value.startswith("@"):
        return "\0" + value[1:]
    return value


def _watchdog_interval(env: Mapping[str, str]) -> float | None:
    """Half of WATCHDOG_USEC, when the watchdog is meant for this process."""
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    return usec / 1_000_000 / 2


def _one_line(value: str | int) -> str:
    """A newline inside a value would start a new field in the datagram."""
    if isinstance(value, bool):
        value = int(value)
    return str(value).replace("\n", " ")
