"""The HTTP endpoint outlives whatever its clients do, in whatever order the kernel reports it.

A real server on a free loopback port. `HeldMetrics` holds the server's one thread inside a
`/metrics` render while the test's clients connect, talk, hang up or reset, so that their
events reach the server together in one `select()` batch once released: the orders that
killed the thread under a connection flood (issue #69) come up here on demand.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from navrl_daemon.ops.http import Health, MetricsServer
from navrl_daemon.ops.metrics import Metrics
from tests.ops.test_http import get

# Seconds the test waits for the held render to begin; the server answers in milliseconds.
HOLD_WAIT_S = 5.0


class HeldMetrics(Metrics):
    """Metrics whose `render` waits while held: the serving thread stops there, and every
    client event meanwhile queues up for its next `select()`."""

    def __init__(self) -> None:
        super().__init__(version="0.1.0", torch_version="2.13.0", device="cpu")
        self.entered = threading.Event()
        self.released = threading.Event()
        self.released.set()

    def render(self) -> bytes:
        self.entered.set()
        self.released.wait(HOLD_WAIT_S * 2)
        return super().render()


@dataclass
class Clients:
    """The test's side: sockets to the server, opened and ended by the actions."""

    port: int
    open: list[socket.socket] = field(default_factory=list)

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        self.open.append(sock)
        return sock

    def end(self, sock: socket.socket, how: str) -> None:
        if how == "reset":  # RST instead of FIN
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        if how == "half-close":  # no more requests, still reading
            sock.shutdown(socket.SHUT_WR)
            return
        self.open.remove(sock)
        sock.close()

    def close_all(self) -> None:
        for sock in self.open:
            sock.close()
        self.open.clear()


def hold(metrics: HeldMetrics, clients: Clients) -> bool:
    """Stop the serving thread in a render; False if it did not get there."""
    metrics.released.clear()
    metrics.entered.clear()
    clients.connect().sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
    return metrics.entered.wait(HOLD_WAIT_S)


@dataclass
class Served:
    server: MetricsServer
    metrics: HeldMetrics


@contextmanager
def serving(max_connections: int) -> Iterator[Served]:
    metrics = HeldMetrics()
    server = MetricsServer(
        metrics, Health(stall_after_s=30.0), "127.0.0.1", 0, max_connections=max_connections
    )
    server.start()
    try:
        yield Served(server, metrics)
    finally:
        metrics.released.set()
        server.stop()


def assert_still_answering(server: MetricsServer) -> None:
    assert get(server, "/metrics").status == 200
    assert get(server, "/healthz").status == 503  # "starting": nobody set it running


def test_a_client_evicted_in_the_batch_that_also_holds_its_hang_up_is_not_read() -> None:
    """Two silent clients hang up while two new ones queue: one select() reports the
    listener before the hang-ups, an accept evicts a silent client to make room, and its
    hang-up comes later in the same batch. The serving thread used to read the closed
    socket and die (`Invalid file descriptor: -1`); /metrics and /healthz never answered
    again."""
    with serving(max_connections=3) as served:
        server, metrics = served.server, served.metrics
        clients = Clients(server.port)
        first, second = clients.connect(), clients.connect()
        assert hold(metrics, clients)  # both silent clients are in; the thread waits
        clients.connect(), clients.connect()  # queued: the listener is ready first...
        time.sleep(0.2)  # ...once the kernel has queued both (loopback: microseconds)
        clients.end(first, "close")
        clients.end(second, "reset")
        metrics.released.set()
        assert_still_answering(server)
        assert server.dropped["evicted"] >= 1
        clients.close_all()


# One client action: what to do, and which of the open sockets (an index, taken modulo).
ACTION = st.one_of(
    st.tuples(st.just("connect"), st.just(0)),
    st.tuples(
        st.sampled_from(["request", "partial", "garbage", "close", "reset", "half-close"]),
        st.integers(0, 15),
    ),
)
# Rounds of actions, each done while the serving thread is held in a render (True: its
# events then arrive in one batch) or while it serves them as they come (False).
ROUNDS = st.lists(st.tuples(st.booleans(), st.lists(ACTION, max_size=8)), max_size=6)


def act(clients: Clients, action: str, index: int) -> None:
    if action == "connect":
        if len(clients.open) < 24:  # bounded: the server holds at most 4 anyway
            clients.connect()
        return
    if not clients.open:
        return
    sock = clients.open[index % len(clients.open)]
    try:
        if action == "request":
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        elif action == "partial":
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHo")
        elif action == "garbage":
            sock.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x02\x00")
        else:
            clients.end(sock, action)
    except OSError:  # the server closed it first (evicted, answered): fine
        clients.end(sock, "close")


@settings(max_examples=100, deadline=None, database=None)
@given(rounds=ROUNDS, max_connections=st.integers(2, 4))
def test_the_endpoint_survives_any_order_of_client_events(
    rounds: list[tuple[bool, list[tuple[str, int]]]], max_connections: int
) -> None:
    with serving(max_connections) as served:
        server, metrics = served.server, served.metrics
        clients = Clients(server.port)
        for held, actions in rounds:
            if held:
                hold(metrics, clients)
            for action, index in actions:
                act(clients, action, index)
            metrics.released.set()
        assert_still_answering(server)
        clients.close_all()
        assert_still_answering(server)
