"""sd_notify against real AF_UNIX datagram sockets, in both address forms systemd uses."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from navrl_daemon.runtime.sd_notify import ProgressWatchdog, SystemdNotifier


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class NotifyListener:
    """What systemd does with $NOTIFY_SOCKET: a bound datagram socket it reads from."""

    def __init__(self, sock: socket.socket, notify_socket: str) -> None:
        self.sock = sock
        self.notify_socket = notify_socket

    def receive(self) -> str:
        return self.sock.recv(4096).decode()

    def drain(self) -> list[str]:
        messages = []
        self.sock.setblocking(False)
        try:
            while True:
                messages.append(self.sock.recv(4096).decode())
        except BlockingIOError:
            pass
        finally:
            self.sock.settimeout(2.0)
        return messages

    def environ(self, **extra: str) -> dict[str, str]:
        return {"NOTIFY_SOCKET": self.notify_socket, **extra}


@pytest.fixture(params=["path", "abstract"])
def listener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NotifyListener]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        address = str(tmp_path / "notify.sock")
        sock.bind(address)
        notify_socket = address
    else:
        name = f"navrl-test-{secrets.token_hex(8)}"
        sock.bind("\0" + name)
        notify_socket = "@" + name
    sock.settimeout(2.0)
    try:
        yield NotifyListener(sock, notify_socket)
    finally:
        sock.close()


def test_each_message_arrives_as_sent(listener: NotifyListener) -> None:
    notifier = SystemdNotifier(listener.environ())
    assert notifier.enabled

    assert notifier.ready()
    assert listener.receive() == "READY=1"
    assert notifier.status("iteration 12, 3400 frames/s")
    assert listener.receive() == "STATUS=iteration 12, 3400 frames/s"
    assert notifier.watchdog()
    assert listener.receive() == "WATCHDOG=1"
    assert notifier.stopping()
    assert listener.receive() == "STOPPING=1"
    assert notifier.extend_timeout(2.5)
    assert listener.receive() == "EXTEND_TIMEOUT_USEC=2500000"
    notifier.close()


def test_several_fields_travel_in_one_datagram(listener: NotifyListener) -> None:
    notifier = SystemdNotifier(listener.environ())

    assert notifier.ready(status="iteration 1")
    assert listener.receive() == "READY=1\nSTATUS=iteration 1"
    assert notifier.stopping(status="flushing checkpoints")
    assert listener.receive() == "STOPPING=1\nSTATUS=flushing checkpoints"
    assert notifier.notify(STATUS="draining", EXTEND_TIMEOUT_USEC=5_000_000)
    assert listener.receive() == "STATUS=draining\nEXTEND_TIMEOUT_USEC=5000000"
    assert listener.drain() == []
    notifier.close()


def test_a_newline_in_a_value_cannot_forge_a_field(listener: NotifyListener) -> None:
    notifier = SystemdNotifier(listener.environ())

    assert notifier.status("line one\nREADY=1")
    assert listener.receive() == "STATUS=line one READY=1"
    notifier.close()


def test_after_close_every_call_returns_false(listener: NotifyListener) -> None:
    notifier = SystemdNotifier(listener.environ())
    notifier.close()
    notifier.close()

    assert not notifier.enabled
    assert not notifier.ready()
    assert listener.drain() == []


def test_without_notify_socket_every_call_is_a_no_op() -> None:
    notifier = SystemdNotifier({"WATCHDOG_USEC": "2000000"})

    assert not notifier.enabled
    assert notifier.watchdog_interval is None
    assert not notifier.ready("x")
    assert not notifier.status("x")
    assert not notifier.watchdog()
    assert not notifier.stopping()
    assert not notifier.extend_timeout(10)
    assert not notifier.notify(READY=1)
    notifier.close()


def test_a_missing_socket_path_returns_false(tmp_path: Path) -> None:
    notifier = SystemdNotifier({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens.sock")})

    assert notifier.enabled
    assert not notifier.ready()
    assert not notifier.status("still here")
    notifier.close()


def test_the_process_environment_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not SystemdNotifier().enabled


@pytest.mark.parametrize(
    ("extra", "interval"),
    [
        ({"WATCHDOG_USEC": "2000000"}, 1.0),
        ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}, 1.0),
        ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval_is_half_of_watchdog_usec_for_this_pid(
    tmp_path: Path, extra: dict[str, str], interval: float | None
) -> None:
    notifier = SystemdNotifier({"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), **extra})

    assert notifier.watchdog_interval == interval
    notifier.close()


@pytest.mark.anyio
async def test_progress_watchdog_pings_only_while_progress_is_made(
    listener: NotifyListener,
) -> None:
    notifier = SystemdNotifier(listener.environ(WATCHDOG_USEC="100000"))
    assert notifier.watchdog_interval == pytest.approx(0.05)
    watchdog = ProgressWatchdog(notifier)

    async with anyio.create_task_group() as tg:
        tg.start_soon(watchdog.run)

        for _ in range(30):  # 0.3 s of training, an iteration every 10 ms
            watchdog.progress()
            await anyio.sleep(0.01)
        while_training = listener.drain()
        assert len(while_training) >= 2
        assert set(while_training) == {"WATCHDOG=1"}

        await anyio.sleep(0.3)  # stalled: at most the ping owed to the last progress
        assert len(listener.drain()) <= 1
        await anyio.sleep(0.2)
        assert listener.drain() == []

        for _ in range(15):  # training resumes, so do the pings
            watchdog.progress()
            await anyio.sleep(0.01)
        await anyio.sleep(0.1)
        assert "WATCHDOG=1" in listener.drain()

        tg.cancel_scope.cancel()
    notifier.close()


@pytest.mark.anyio
async def test_progress_watchdog_returns_at_once_without_a_watchdog(
    listener: NotifyListener,
) -> None:
    notifier = SystemdNotifier(listener.environ())  # no WATCHDOG_USEC
    watchdog = ProgressWatchdog(notifier)
    watchdog.progress()

    with anyio.fail_after(1):
        await watchdog.run()
    assert listener.drain() == []
    notifier.close()


def test_progress_watchdog_records_when_progress_was_last_seen() -> None:
    ticks = iter([10.0, 12.5])
    watchdog = ProgressWatchdog(SystemdNotifier({}), clock=lambda: next(ticks))

    assert watchdog.last_progress_at is None
    watchdog.progress()
    assert watchdog.last_progress_at == 10.0
    watchdog.progress()
    assert watchdog.last_progress_at == 12.5
